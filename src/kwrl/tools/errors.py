"""The one error a tool raises on purpose: a message the model can act on."""


class ToolError(Exception):
    """Reported to the agent as an MCP tool error (`isError`), never as a crash.

    The message says what went wrong and what to do instead, e.g. "no sheet 'Revnue' in
    Finance/model.xlsx; sheets: Revenue, EBITDA".
    """
