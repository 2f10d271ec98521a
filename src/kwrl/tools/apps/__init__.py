"""The apps an agent works through: one class per app, one tool per public method.

Each app is plain Python, constructed with the workspace root (`Sheets(root)`); the MCP layer
(`kwrl.tools.server`) turns every public method into a tool, its schema from the type hints and
its description from the docstring, prefixed with the app name on a combined endpoint
(`sheets_read_range`). The apps share one contract (see `base.py`): workspace-relative paths
checked by `kwrl.tools.paths.resolve`; outputs that are never empty, one record per line with
values exactly as stored, cut by `truncate` with a hint on how to read the rest; `ToolError`
with an actionable message for anything the agent can fix, a corrupt file included; atomic
saves. The lesson behind the output shapes: tools that return only the relevant lines, each
labelled, make retrieval learnable for a small model; whole tables do not.
"""

from kwrl.tools.apps.calendar import Calendar
from kwrl.tools.apps.chat import Chat
from kwrl.tools.apps.docs import Docs
from kwrl.tools.apps.filesystem import Filesystem
from kwrl.tools.apps.mail import Mail
from kwrl.tools.apps.pdf import Pdf
from kwrl.tools.apps.sheets import Sheets
from kwrl.tools.apps.slides import Slides

APPS: dict[str, type] = {
    "filesystem": Filesystem,
    "pdf": Pdf,
    "sheets": Sheets,
    "docs": Docs,
    "slides": Slides,
    "mail": Mail,
    "chat": Chat,
    "calendar": Calendar,
}

__all__ = ["APPS", "Calendar", "Chat", "Docs", "Filesystem", "Mail", "Pdf", "Sheets", "Slides"]
