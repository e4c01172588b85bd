"""Every status the server can give for an operation is in the OpenAPI document.

The statuses are found in the code, not listed here: every route the server registers
(topod.api.server.routes) is walked from its handler through the functions it calls (in
topod's own modules, the daemon's and the lease service's methods it reaches through the
backend), and every error it raises or builds is mapped to a status by the table the server
answers with (topod.api.answers.STATUS_OF_CODE). A new route, or a new error deep in a
route's code, that the document does not list fails here."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
from typing import Any

import pytest
from aiohttp import web

from topod.api.answers import status_of
from topod.api.openapi import ANY_OPERATION, openapi_document
from topod.api.server import routes
from topod.errors import TopodError
from topod.service.daemon import Daemon
from topod.service.leases import LeaseService

DOCUMENT = openapi_document()
# What an attribute reached through the backend is: `backend.x` is the daemon's, `….alloc.x`
# the lease service's (and `….scopes.x` the lease scopes', `….store.x` the lease store's,
# `….lifecycle.x` and `….queue.x` the parts the lease service holds, `….reports.x` the
# daemon's reports).
OWNERS: dict[str, type] = {"backend": Daemon, "alloc": LeaseService}


def _owners() -> dict[str, type]:
    from topod.service.daemon_reports import DaemonReports
    from topod.service.lease_lifecycle import LeaseLifecycle
    from topod.service.lease_queue import WaitingQueue
    from topod.service.lease_scope import LeaseScopes
    from topod.service.lease_store import LeaseStore

    return {**OWNERS, "scopes": LeaseScopes, "store": LeaseStore, "lifecycle": LeaseLifecycle, "queue": WaitingQueue,
            "reports": DaemonReports}


class _Backend:
    alloc = None
    allowed_group = None


def _routes() -> list[tuple[str, str, Any]]:
    app = routes(_Backend())
    found = []
    for route in app.router.routes():
        if route.method == "HEAD":  # aiohttp's for every GET
            continue
        found.append((route.method, route.resource.canonical, route.handler))
    return found


class StatusFinder:
    """The statuses a function can answer with: the errors (TopodError, PermissionError,
    aiohttp's HTTP exceptions) it raises, and those raised by what it calls, less those a
    `try` around the call catches. A raise counts the errors built in its expression, the
    errors the functions called there return, and, for `raise name`, what `name` was
    assigned. A callee is followed where it can be named: a function of topod's, a method
    of self's class, or a method of the daemon, lease service or lease scopes reached
    through the backend. Errors a function builds for someone else (set on a waiter's
    future) are not this request's."""

    def __init__(self) -> None:
        self.owners = _owners()
        self._raises: dict[Any, set[tuple[type, str]]] = {}
        self._returns: dict[Any, set[tuple[type, str]]] = {}

    def statuses(self, function: Any) -> dict[int, set[str]]:
        """{status: where each error that gives it comes from}"""
        found: dict[int, set[str]] = {}
        for cls, where in self.raises(function, None):
            status = _status_of_class(cls)
            if status is not None:
                found.setdefault(status, set()).add(f"{cls.__name__} in {where}")
        return found

    # -- per function --------------------------------------------------------------------
    def raises(self, function: Any, owner: type | None) -> set[tuple[type, str]]:
        parsed = self._parse(function)
        if parsed is None:
            return set()
        function, tree = parsed
        if function in self._raises:
            return self._raises[function]
        self._raises[function] = set()  # a cycle adds nothing
        context = (function.__globals__, owner, f"{function.__module__}.{function.__qualname__}", tree)
        found: set[tuple[type, str]] = set()
        self._visit(tree, (), context, found)
        self._raises[function] = found
        return found

    def returns(self, function: Any, owner: type | None) -> set[tuple[type, str]]:
        """The errors a function returns (for `raise f(...)`)."""
        parsed = self._parse(function)
        if parsed is None:
            return set()
        function, tree = parsed
        if function in self._returns:
            return self._returns[function]
        self._returns[function] = set()
        context = (function.__globals__, owner, f"{function.__module__}.{function.__qualname__}", tree)
        found: set[tuple[type, str]] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Return) and node.value is not None:
                found |= self._built(node.value, context)
        self._returns[function] = found
        return found

    def _parse(self, function: Any) -> tuple[Any, ast.AST] | None:
        function = inspect.unwrap(getattr(function, "__func__", function))
        if not isinstance(function, types.FunctionType) or not function.__module__.startswith("topod."):
            return None
        try:
            return function, ast.parse(textwrap.dedent(inspect.getsource(function)))
        except (OSError, TypeError, SyntaxError):
            return None

    # -- the walk ------------------------------------------------------------------------
    def _visit(self, node: ast.AST, caught: tuple[type, ...], context, found: set) -> None:
        if isinstance(node, ast.Try):
            handled = caught + tuple(self._handled(handler, context) for handler in node.handlers)
            for child in node.body:
                self._visit(child, handled, context, found)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                self._visit(child, caught, context, found)
            return
        if isinstance(node, ast.Raise) and node.exc is not None:
            found |= {item for item in self._built(node.exc, context, assigned=True) if not _caught(item[0], caught)}
        if isinstance(node, ast.Call):
            target, owner = self._resolve(node.func, context)
            if not isinstance(target, type) and target is not None:
                found |= {item for item in self.raises(target, owner) if not _caught(item[0], caught)}
        for child in ast.iter_child_nodes(node):
            self._visit(child, caught, context, found)

    def _built(self, expression: ast.AST, context, assigned: bool = False) -> set[tuple[type, str]]:
        """The errors an expression makes: classes called or named, what called functions
        return, and (assigned) what a raised name was assigned in the function."""
        names, _, where, tree = context
        found: set[tuple[type, str]] = set()
        for node in ast.walk(expression):
            if isinstance(node, (ast.Call, ast.Name, ast.Attribute)):
                target, owner = self._resolve(node.func if isinstance(node, ast.Call) else node, context)
                if isinstance(target, type) and issubclass(target, BaseException):
                    found.add((target, where))
                elif isinstance(node, ast.Call) and target is not None:
                    found |= self.returns(target, owner)
            if assigned and isinstance(node, ast.Name) and not isinstance(names.get(node.id), type):
                for assignment in ast.walk(tree):
                    if isinstance(assignment, ast.Assign) and any(
                            isinstance(t, ast.Name) and t.id == node.id for t in assignment.targets):
                        found |= self._built(assignment.value, context)
                    elif isinstance(assignment, ast.ExceptHandler) and assignment.name == node.id:
                        handled = self._handled(assignment, context)  # raise f(exc): what was caught
                        for cls in handled if isinstance(handled, tuple) else (handled,):
                            found.add((cls, where))
        return found

    def _handled(self, handler: ast.ExceptHandler, context) -> Any:
        if handler.type is None:
            return BaseException
        types_ = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        resolved = tuple(t for t in (self._resolve(e, context)[0] for e in types_) if isinstance(t, type))
        return resolved or ()

    def _owner_of(self, node: ast.AST, owner: type | None) -> type | None:
        if isinstance(node, ast.Name) and node.id == "self":
            return owner
        if isinstance(node, ast.Subscript):  # request.app[BACKEND]
            return self.owners["backend"]
        last = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        return self.owners.get(last)

    def _resolve(self, func: ast.AST, context) -> tuple[Any, type | None]:
        """(what `func` names, the class of the object it is a method of)"""
        names, owner, _, _ = context
        if isinstance(func, ast.Name):
            import builtins

            return names.get(func.id, getattr(builtins, func.id, None)), owner
        if isinstance(func, ast.Attribute):
            holder = self._owner_of(func.value, owner)
            if holder is not None:
                return getattr(holder, func.attr, None), holder
            if isinstance(func.value, ast.Name):
                module = names.get(func.value.id)
                if isinstance(module, (types.ModuleType, type)):
                    return getattr(module, func.attr, None), module if isinstance(module, type) else None
        return None, None


def _caught(cls: type, caught: tuple) -> bool:
    flat = [c for group in caught for c in (group if isinstance(group, tuple) else (group,))]
    return any(issubclass(cls, c) for c in flat)


def _status_of_class(cls: type) -> int | None:
    if issubclass(cls, TopodError):
        return status_of(cls.code)
    if issubclass(cls, web.HTTPException) and getattr(cls, "status_code", 0) >= 400:
        return cls.status_code
    if issubclass(cls, PermissionError):  # answers.error_document: 403 permission_denied
        return 403
    return None


def _documented(method: str, path: str) -> set[int]:
    responses = DOCUMENT["paths"][path][method.lower()]["responses"]
    return {int(status) for status in responses if status[0] in "45"}


ROUTES = _routes()


def test_every_route_is_documented_and_every_documented_operation_is_served():
    served = {(method, path) for method, path, _ in ROUTES}
    documented = {(method.upper(), path) for path, item in DOCUMENT["paths"].items()
                  for method in item if method != "parameters"}
    assert served == documented


@pytest.mark.parametrize("method, path", [(m, p) for m, p, _ in ROUTES])
def test_every_operation_lists_what_any_request_can_get(method, path):
    assert set(ANY_OPERATION) <= _documented(method, path)
    assert {400, 500, 503} <= set(ANY_OPERATION), "unparsable HTTP, a fault, admission (the connection gate)"


@pytest.mark.parametrize("method, path, handler", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_every_status_a_routes_code_can_give_is_documented(method, path, handler):
    found = StatusFinder().statuses(handler)
    missing = {status: sorted(sources)[:3] for status, sources in found.items()
               if status not in _documented(method, path)}
    assert not missing, f"{method} {path} can answer {missing} which the OpenAPI document does not list"


def test_the_finder_sees_an_authorization_refusal_deep_in_the_daemon():
    # POST /v1/telemetry as a member: 403 from the lease rules, three calls below the handler
    handler = next(h for m, p, h in ROUTES if (m, p) == ("POST", "/v1/telemetry"))
    found = StatusFinder().statuses(handler)
    assert 403 in found and any("telemetry_authority" in source for source in found[403]), found.get(403)
    assert {400, 408, 413, 415} <= set(found), "the body's errors, from read_json"


def test_the_finder_follows_the_lease_service_into_the_parts_it_holds():
    # DELETE /v1/leases/{id}: 404 and 403 come from the lease lifecycle the service holds;
    # POST /v1/leases: a full queue (503) and a wait that times out from the waiting path
    release = next(h for m, p, h in ROUTES if (m, p) == ("DELETE", "/v1/leases/{id}"))
    found = StatusFinder().statuses(release)
    assert any("LeaseLifecycle" in source for source in found.get(404, ())), found.get(404)
    assert any("LeaseLifecycle" in source for source in found.get(403, ())), found.get(403)
    create = next(h for m, p, h in ROUTES if (m, p) == ("POST", "/v1/leases"))
    sources = {source for where in StatusFinder().statuses(create).values() for source in where}
    assert any(source.startswith("QueueFullError") for source in sources), sorted(sources)
    assert any(source.startswith("WaitTimeoutError") for source in sources), sorted(sources)


def test_each_documented_error_status_names_the_codes_the_server_gives_it():
    from topod.api.answers import STATUS_OF_CODE

    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            for status, response in operation["responses"].items():
                codes = [code for code, given in STATUS_OF_CODE.items() if str(given) == status]
                for code in codes:
                    assert re.search(rf"\b{code}\b", response["description"]), (method, path, status, code)
