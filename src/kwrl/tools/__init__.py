"""Tools an agent acts through: MCP servers per app, and code tools (bash, read, write, ...).

The contract every app follows (`kwrl.tools.apps`): an app is a class constructed with the
workspace root; each public method is one tool, with typed parameters (the MCP schema comes from
the type hints), a docstring the model reads, and a `str` return value that is never empty.
A problem the agent can fix (a wrong path, a missing sheet, an ambiguous edit) raises `ToolError`
with a message saying what to do instead. Paths are workspace-relative and resolved with
`kwrl.tools.paths.resolve`, which refuses anything outside the root. Large outputs are cut by
`kwrl.tools.truncate.truncate`, head and tail, with a note on how to read the rest.
"""

from kwrl.tools.errors import ToolError

__all__ = ["ToolError"]
