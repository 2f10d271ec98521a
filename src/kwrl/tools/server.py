"""App objects -> one MCP server: every public method of an app becomes a tool.

An app (`kwrl.tools.apps`) is a plain class built with the workspace root; its public methods are
typed, documented and return a non-empty `str`. `build_server` turns the instances into an
`MCPServer` (the official SDK's high-level server): the input schema comes from the type hints,
the description from the docstring. With one app the tool names are the method names; with
several (the combined endpoint of a world) they are `{app}_{method}`, as in the recipe kwrl
reproduces.

Each call is wrapped so that a rollout never dies of a tool:
- the method runs in its own daemon thread and the server stops waiting after `tool_timeout_s`
  (answering "X timed out after N s; try a smaller range"); Python cannot kill the thread, so it
  finishes in the background, and the process (one per trial) is killed when the trial ends;
- `ToolError` becomes an error result (`isError`) carrying the message; any other exception
  becomes an error result naming its type and message (the SDK alone would hide the message);
- the text is cut head and tail to `output_limit` characters and is never empty or None.

Definitions are checked when the server is built, not when the model first calls a tool: a
public method without a docstring, a parameter without a type, or a return annotation other
than `str` raises `ToolDefinitionError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import threading
import typing
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
from mcp.server import MCPServer
from mcp.types import CallToolResult, TextContent

from kwrl.tools.errors import ToolError
from kwrl.tools.truncate import DEFAULT_LIMIT, truncate

logger = logging.getLogger(__name__)

DEFAULT_TOOL_TIMEOUT_S = 60.0
"""One tool call; the recipe's agent harness used the same bound."""
TRUNCATION_HINT = "ask for a smaller part (fewer pages, a narrower range) to see the rest"

ToolFunction = Callable[..., Coroutine[Any, Any, CallToolResult]]
T = TypeVar("T")


class ToolDefinitionError(TypeError):
    """An app breaks the tool contract (no docstring, untyped parameter, non-`str` return)."""


def tool_methods(app_class: type) -> dict[str, Callable[..., Any]]:
    """The public methods of `app_class` that become tools, by name (sorted).

    Public means: a plain function defined on the class or a base (not `object`), whose name
    does not start with `_`. Static methods, class methods and properties are not tools.
    """
    methods: dict[str, Callable[..., Any]] = {}
    for name in sorted(dir(app_class)):
        if name.startswith("_"):
            continue
        attribute = inspect.getattr_static(app_class, name)
        if inspect.isfunction(attribute):
            methods[name] = attribute
    return methods


def check_tool_method(app_name: str, name: str, method: Callable[..., Any]) -> dict[str, Any]:
    """The resolved type hints of a tool method; ToolDefinitionError if it breaks the contract."""
    where = f"{app_name}.{name}"
    if not (inspect.getdoc(method) or "").strip():
        raise ToolDefinitionError(f"tool {where} has no docstring (the model reads it)")
    try:
        hints = typing.get_type_hints(method, include_extras=True)
    except Exception as exc:
        raise ToolDefinitionError(f"tool {where}: type hints cannot be resolved: {exc}") from exc
    if hints.get("return") is not str:
        raise ToolDefinitionError(
            f"tool {where} must be annotated '-> str', not {hints.get('return', 'nothing')!r}"
        )
    parameters = list(inspect.signature(method).parameters.values())[1:]  # drop self
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool {where} may not take *args or **kwargs")
        if parameter.name not in hints:
            raise ToolDefinitionError(f"tool {where}: parameter '{parameter.name}' has no type")
    return hints


def check_app(app_name: str, app_class: type) -> dict[str, dict[str, Any]]:
    """Hints of every tool method of `app_class`; ToolDefinitionError on the first problem."""
    methods = tool_methods(app_class)
    if not methods:
        raise ToolDefinitionError(f"app {app_name} ({app_class.__qualname__}) has no tools")
    return {name: check_tool_method(app_name, name, fn) for name, fn in methods.items()}


def build_server(
    root: Path,
    apps: Mapping[str, type] | None = None,
    prefix: bool | None = None,
    tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
    output_limit: int = DEFAULT_LIMIT,
) -> MCPServer:
    """An MCP server whose tools are the public methods of each app, constructed with `root`.

    `apps` maps an app name to its class (default: every app in `kwrl.tools.apps.APPS`).
    `prefix` names tools `{app}_{method}`; by default it is on when there is more than one app.
    """
    return prepare_server(apps, prefix, tool_timeout_s, output_limit).bind(root)


class PreparedServer:
    """A server whose tools are registered (schemas built) but whose apps are not constructed yet.

    Building schemas is the slow part of `build_server` (a pydantic model per tool), and it does
    not depend on the workspace. The tool host prepares a server once in its pre-imported parent
    and each forked trial process only calls `bind(root)`, which constructs the app objects.
    """

    def __init__(self, server: MCPServer, apps: Mapping[str, type]) -> None:
        self.server = server
        self.apps = dict(apps)
        self.instances: dict[str, Any] = {}

    def bind(self, root: Path) -> MCPServer:
        """Construct every app with the workspace `root` and return the server; once only."""
        if self.instances:
            raise RuntimeError("this server is already bound to a workspace")
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"workspace root is not a directory: {root}")
        self.instances.update({name: app_class(root) for name, app_class in self.apps.items()})
        return self.server


def prepare_server(
    apps: Mapping[str, type] | None = None,
    prefix: bool | None = None,
    tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
    output_limit: int = DEFAULT_LIMIT,
) -> PreparedServer:
    """Check the apps and register their tools; `bind(root)` on the result makes it servable."""
    if apps is None:
        apps = registered_apps()
    if not apps:
        raise ValueError("no apps to serve")
    if tool_timeout_s <= 0 or output_limit <= 0:
        raise ValueError("tool_timeout_s and output_limit must be positive")
    use_prefix = len(apps) > 1 if prefix is None else prefix
    checked = {app_name: check_app(app_name, app_class) for app_name, app_class in apps.items()}
    name = "kwrl-" + "+".join(apps) if len(apps) < 3 else "kwrl"
    prepared = PreparedServer(MCPServer(name, log_level="WARNING"), apps)
    registered: set[str] = set()
    for app_name, app_class in apps.items():
        for method_name, hints in checked[app_name].items():
            tool_name = f"{app_name}_{method_name}" if use_prefix else method_name
            if tool_name in registered:
                raise ToolDefinitionError(f"two tools would both be named '{tool_name}'")
            registered.add(tool_name)
            method = getattr(app_class, method_name)
            fn = _tool_function(
                tool_name, _late_bound(prepared, app_name, method_name), method, hints,
                tool_timeout_s, output_limit,
            )
            description = inspect.getdoc(method) or ""
            prepared.server.add_tool(
                fn, name=tool_name, description=description, structured_output=False
            )
    return prepared


def _late_bound(prepared: PreparedServer, app_name: str, method_name: str) -> Callable[..., Any]:
    """Calls `method_name` on the app instance that `prepared.bind` constructs."""

    def call(**arguments: Any) -> Any:
        if app_name not in prepared.instances:
            raise RuntimeError("the server is not bound to a workspace")
        return getattr(prepared.instances[app_name], method_name)(**arguments)

    return call


def _tool_function(
    tool_name: str,
    target: Callable[..., Any],
    method: Callable[..., Any],
    hints: Mapping[str, Any],
    timeout_s: float,
    output_limit: int,
) -> ToolFunction:
    """An async function with the signature of `method` (self dropped) that never raises.

    The SDK reads the schema from `__signature__` and `__annotations__`, so these carry the
    resolved hints (string annotations from `from __future__ import annotations` included).
    """

    async def call(**arguments: Any) -> CallToolResult:
        return await run_tool_call(tool_name, target, arguments, timeout_s, output_limit)

    parameters = list(inspect.signature(method).parameters.values())[1:]  # drop self
    parameters = [p.replace(annotation=hints[p.name]) for p in parameters]
    call.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        parameters, return_annotation=str
    )
    call.__annotations__ = {p.name: hints[p.name] for p in parameters} | {"return": str}
    call.__name__ = call.__qualname__ = tool_name
    call.__doc__ = inspect.getdoc(method)
    return call


async def run_tool_call(
    tool_name: str,
    method: Callable[..., Any],
    arguments: Mapping[str, Any],
    timeout_s: float,
    output_limit: int,
) -> CallToolResult:
    """Run one call in a worker thread, bounded by `timeout_s`; every outcome is a result."""
    deadline = anyio.move_on_after(timeout_s)
    try:
        with deadline:
            value = await _call_in_daemon_thread(lambda: method(**arguments), tool_name)
    except ToolError as exc:
        return _result(str(exc) or f"{tool_name} failed", True, output_limit)
    except Exception as exc:
        logger.warning("tool %s raised %s: %s", tool_name, type(exc).__name__, exc)
        logger.debug("traceback of %s", tool_name, exc_info=exc)
        return _result(f"{tool_name} failed: {type(exc).__name__}: {exc}", True, output_limit)
    if deadline.cancelled_caught:
        message = f"{tool_name} timed out after {timeout_s:g} s; try a smaller range"
        return _result(message, True, output_limit)
    if value is None or (isinstance(value, str) and not value.strip()):
        return _result(f"{tool_name} returned no output", False, output_limit)
    return _result(value if isinstance(value, str) else str(value), False, output_limit)


async def _call_in_daemon_thread(fn: Callable[[], T], name: str) -> T:
    """Run `fn` in a new daemon thread and wait for it (asyncio; the SDK's servers run on it).

    Not anyio's worker pool: a call abandoned at its timeout keeps running, and in the pool it
    would hold a slot (40 in all) and, being a non-daemon thread, hold up the process's exit
    after the client hung up. A thread per call costs ~0.1 ms.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():  # the caller stopped waiting (timeout or cancellation)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def target() -> None:
        value, error = None, None
        try:
            value = fn()
        except Exception as exc:
            error = exc
        except BaseException as exc:  # SystemExit from a library must not stop the server
            error = RuntimeError(f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=target, name=f"kwrl-tool-{name}", daemon=True).start()
    return await future


def _result(text: str, is_error: bool, output_limit: int) -> CallToolResult:
    text = truncate(text, output_limit, hint=TRUNCATION_HINT)
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=is_error)


def registered_apps() -> dict[str, type]:
    """`kwrl.tools.apps.APPS` (name -> app class), imported on first use."""
    try:
        from kwrl.tools.apps import APPS
    except ImportError as exc:
        raise LookupError(f"the apps package is not available: {exc}") from exc
    return dict(APPS)


def load_apps(specs: Sequence[str]) -> dict[str, type]:
    """Resolve app specs to classes: a registered name, `all`, or `module:Class` for a custom app.

    A custom app is named by its class, lowercased, without an `App` suffix (`EchoApp` -> `echo`),
    unless the spec gives a name: `name=module:Class`. Raises LookupError for an unknown app.
    """
    apps: dict[str, type] = {}
    for spec in specs:
        if ":" in spec:
            name, app_class = _import_app(spec)
            apps[name] = app_class
            continue
        known = registered_apps()
        if spec == "all":
            apps.update(known)
        elif spec in known:
            apps[spec] = known[spec]
        else:
            raise LookupError(f"unknown app '{spec}'; known: all, {', '.join(sorted(known))}")
    if not apps:
        raise LookupError("no app given")
    return apps


def _import_app(spec: str) -> tuple[str, type]:
    name, _, ref = spec.rpartition("=")
    module_name, _, class_name = ref.partition(":")
    try:
        app_class = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise LookupError(f"cannot import app '{ref}': {exc}") from exc
    if not isinstance(app_class, type):
        raise LookupError(f"'{ref}' is not a class")
    default = class_name.lower().removesuffix("app") or class_name.lower()
    return name or default, app_class
