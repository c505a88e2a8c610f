"""An in-process Kubernetes API server for tests: the few real REST paths pdscale uses, with real bodies.

No API server can run on these machines, so the actuator and leader election are tested with the official
``kubernetes`` client against this threaded HTTP server. It answers what a real API server answers on
these paths (checked against kube-apiserver 1.31 behaviour):

- ``apps/v1`` Deployments: GET one, LIST (per namespace and across namespaces) with ``labelSelector``
  (``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x,y)``, ``a``, ``!a``), PATCH (merge-patch,
  json-patch, and strategic-merge for patches without lists).
- The ``scale`` subresource: GET, PUT, PATCH with strategic-merge, merge-patch and json-patch content types.
  ``resourceVersion`` is one counter for the whole store (as etcd's revision) and moves only when an object
  really changes; a PUT/PATCH carrying a stale ``metadata.resourceVersion`` gets 409 Conflict.
- ``coordination.k8s.io/v1`` Leases: GET, POST (409 AlreadyExists), PUT (``resourceVersion`` required;
  stale → 409), DELETE.
- ``authorization.k8s.io/v1`` SelfSubjectAccessReview POST, answered from an allow-list of ``AccessRule``;
  with ``enforce_rbac=True`` requests outside the list get 403 Forbidden too.
- ``GET /version``.

Errors are ``Status`` bodies (``kind: Status``, ``apiVersion: v1``, ``reason``, ``code``, ``details``). Not
implemented (answered with a Status that says so): watch, server-side apply, strategic-merge patches that
contain lists, creating Deployments through the API (seed them with ``add_deployment``).

Fault injection: ``inject_status(path, code, count)`` and ``inject_hang(path, seconds, count)``; every
request received is recorded in ``requests`` (method, path, query, content type, parsed body).
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

JSON = dict[str, Any]

CT_STRATEGIC = "application/strategic-merge-patch+json"
CT_MERGE = "application/merge-patch+json"
CT_JSON_PATCH = "application/json-patch+json"
CT_APPLY = "application/apply-patch+yaml"
SERVER_VERSION: JSON = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0+pdscale-test-apiserver",
    "platform": "linux/amd64",
}

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
_CONFLICT_TAIL = "the object has been modified; please apply your changes to the latest version and try again"


class ApiError(Exception):
    """An error answered as a ``Status`` body."""

    def __init__(
        self, code: int, message: str, *, reason: str | None = None, details: JSON | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = details

    def status_body(self) -> JSON:
        body: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


@dataclass(frozen=True)
class _Kind:
    group: str  # "" for the core group
    resource: str  # plural, e.g. "deployments"

    @property
    def qualified(self) -> str:
        """``deployments.apps`` as the API server names a group-resource in messages."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    def not_found(self, name: str) -> ApiError:
        return ApiError(404, f'{self.qualified} "{name}" not found', details=self._details(name))

    def conflict(self, name: str) -> ApiError:
        msg = f'Operation cannot be fulfilled on {self.qualified} "{name}": {_CONFLICT_TAIL}'
        return ApiError(409, msg, details=self._details(name))

    def already_exists(self, name: str) -> ApiError:
        msg = f'{self.qualified} "{name}" already exists'
        return ApiError(409, msg, reason="AlreadyExists", details=self._details(name))

    def _details(self, name: str) -> JSON:
        return {"name": name, "group": self.group, "kind": self.resource}


DEPLOYMENTS = _Kind("apps", "deployments")
LEASES = _Kind("coordination.k8s.io", "leases")


def invalid(kind: str, group: str, name: str, field_path: str, value: Any, detail: str) -> ApiError:
    """422 Invalid as the API server words it: ``Scale.autoscaling "x" is invalid: spec.replicas: ...``."""
    cause_msg = f"Invalid value: {json.dumps(value)}: {detail}"
    qualified = f"{kind}.{group}" if group else kind
    return ApiError(
        422,
        f'{qualified} "{name}" is invalid: {field_path}: {cause_msg}',
        details={
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": "FieldValueInvalid", "message": cause_msg, "field": field_path}],
        },
    )


# -- access rules --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AccessRule:
    """One allowed (verb, group, resource, subresource, namespace, name); ``"*"`` matches anything."""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = "*"
    name: str = "*"

    def allows(self, attrs: Mapping[str, str]) -> bool:
        def ok(mine: str, key: str) -> bool:
            return mine == "*" or mine == attrs.get(key, "")

        return all(
            ok(mine, key)
            for mine, key in (
                (self.verb, "verb"),
                (self.group, "group"),
                (self.resource, "resource"),
                (self.subresource, "subresource"),
                (self.namespace, "namespace"),
                (self.name, "name"),
            )
        )


# -- label selectors -----------------------------------------------------------------------------

_SET_REQ = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_REQ = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")
_EXISTS_REQ = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")


def _split_requirements(selector: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in selector:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


@dataclass(frozen=True)
class _Requirement:
    key: str
    op: str  # "in" | "notin" | "exists" | "!exists"  (a=b is "in" {b}, a!=b is "notin" {b})
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        inside = labels.get(self.key) in self.values
        return inside if self.op == "in" else not inside


def parse_label_selector(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """A predicate over labels for a ``labelSelector`` string; 400 BadRequest if it does not parse."""
    reqs: list[_Requirement] = []
    for text in _split_requirements(selector):
        if m := _SET_REQ.match(text):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(_Requirement(m.group(1), m.group(2), values))
        elif m := _EQ_REQ.match(text):
            reqs.append(
                _Requirement(m.group(1), "notin" if m.group(2) == "!=" else "in", frozenset({m.group(3)}))
            )
        elif m := _EXISTS_REQ.match(text):
            reqs.append(_Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise ApiError(
                400, f"unable to parse requirement: {text.strip()!r} in labelSelector {selector!r}"
            )
    return lambda labels: all(req.matches(labels) for req in reqs)


def selector_string(match_labels: Mapping[str, str]) -> str:
    """``a=b,c=d`` (sorted), as the scale subresource reports ``status.selector``."""
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


# -- patches -------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _contains_list(value: Any) -> bool:
    if isinstance(value, list):
        return True
    if isinstance(value, dict):
        return any(_contains_list(v) for v in value.values())
    return False


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"json patch path {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, tokens: list[str], path: str) -> tuple[Any, str]:
    node = doc
    for tok in tokens[:-1]:
        try:
            node = node[int(tok)] if isinstance(node, list) else node[tok]
        except (KeyError, IndexError, ValueError, TypeError) as err:
            raise ApiError(422, f"json patch: path {path!r} does not exist") from err
    return node, tokens[-1]


def _get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent, last = _parent(doc, tokens, path)
    try:
        return parent[int(last)] if isinstance(parent, list) else parent[last]
    except (KeyError, IndexError, ValueError, TypeError) as err:
        raise ApiError(422, f"json patch: path {path!r} does not exist") from err


def _remove(doc: Any, path: str) -> Any:
    parent, last = _parent(doc, _pointer(path), path)
    try:
        return parent.pop(int(last)) if isinstance(parent, list) else parent.pop(last)
    except (KeyError, IndexError, ValueError, TypeError) as err:
        raise ApiError(422, f"json patch: cannot remove {path!r}: it does not exist") from err


def _add(doc: Any, path: str, value: Any, *, replace: bool) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return copy.deepcopy(value)
    parent, last = _parent(doc, tokens, path)
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if replace:
            parent[index] = copy.deepcopy(value)
        else:
            parent.insert(index, copy.deepcopy(value))
    elif isinstance(parent, dict):
        if replace and last not in parent:
            raise ApiError(422, f"json patch: cannot replace {path!r}: it does not exist")
        parent[last] = copy.deepcopy(value)
    else:
        raise ApiError(422, f"json patch: parent of {path!r} is not an object or array")
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test); failures are 422 as on a real server."""
    if not isinstance(ops, list):
        raise ApiError(400, "json patch body must be a JSON array of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, f"json patch operation {op!r} needs 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace"):
            doc = _add(doc, path, op.get("value"), replace=kind == "replace")
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise ApiError(422, f"json patch: test operation failed at {path!r}")
        elif kind in ("move", "copy"):
            value = _get(doc, op["from"])
            if kind == "move":
                _remove(doc, op["from"])
            doc = _add(doc, path, value, replace=False)
        else:
            raise ApiError(400, f"json patch: unknown operation {kind!r}")
    return doc


# -- faults and records --------------------------------------------------------------------------


@dataclass
class _Fault:
    pattern: str  # fnmatch pattern over the request path
    method: str | None
    remaining: int
    status: int | None = None
    hang_s: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        return (
            self.remaining > 0
            and (self.method is None or self.method == method)
            and fnmatch.fnmatchcase(path, self.pattern)
        )


@dataclass(frozen=True)
class RecordedRequest:
    """One request as received (before authentication and faults)."""

    method: str
    path: str
    query: Mapping[str, tuple[str, ...]]
    content_type: str | None
    body: Any  # parsed JSON, the raw text if it was not JSON, None without a body
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Route:
    kind: str  # "deployments" | "deployment" | "scale" | "leases" | "lease" | "ssar" | "version"
    namespace: str = ""
    name: str = ""


_ROUTES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^/version/?$"), "version"),
    (re.compile(r"^/apis/apps/v1/deployments$"), "deployments"),
    (re.compile(r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/deployments$"), "deployments"),
    (re.compile(r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/deployments/(?P<name>[^/]+)$"), "deployment"),
    (re.compile(r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/deployments/(?P<name>[^/]+)/scale$"), "scale"),
    (re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/leases$"), "leases"),
    (
        re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/leases/(?P<name>[^/]+)$"),
        "lease",
    ),
    (re.compile(r"^/apis/authorization\.k8s\.io/v1/selfsubjectaccessreviews$"), "ssar"),
)

_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _route(path: str) -> _Route:
    for pattern, kind in _ROUTES:
        if m := pattern.match(path):
            groups = m.groupdict()
            return _Route(kind, groups.get("ns") or "", groups.get("name") or "")
    raise ApiError(404, "the server could not find the requested resource", details={})


# -- the server ----------------------------------------------------------------------------------


class FakeKubeApiServer:
    """The in-process API server; a context manager. ``url`` goes into ``Configuration().host``.

    ``token``: when set, requests without ``Authorization: Bearer <token>`` get 401.
    ``access_rules``: the allow-list SelfSubjectAccessReview answers from; ``None`` allows everything.
    ``enforce_rbac``: also answer 403 to requests the rules do not allow.
    ``status_follows_spec``: a Deployment's status replicas follow spec at once (as if every pod were
    ready immediately); turn off and use ``set_ready_replicas`` to model slow rollouts.
    ``clock``: Unix seconds for timestamps (inject a fixed one for reproducible bodies).
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        access_rules: Iterable[AccessRule] | None = None,
        enforce_rbac: bool = False,
        user: str = "system:serviceaccount:pdscale:pdscale-controller",
        status_follows_spec: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.token = token
        self.access_rules = tuple(access_rules) if access_rules is not None else None
        self.enforce_rbac = enforce_rbac
        self.user = user
        self.status_follows_spec = status_follows_spec
        self._clock = clock
        self._lock = threading.RLock()
        self._objects: dict[tuple[str, str, str], JSON] = {}  # (resource, namespace, name) -> object
        self._revision = 1000
        self._faults: list[_Fault] = []
        self._requests: list[RecordedRequest] = []
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Serve on ``127.0.0.1:<free port>`` in a daemon thread."""
        if self._server is not None:
            raise RuntimeError("FakeKubeApiServer.start: already started")
        self._stopping.clear()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="kube-apiserver", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving (hanging requests are released) and close the socket; idempotent."""
        self._stopping.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeKubeApiServer.url: call start() first")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKubeApiServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def write_kubeconfig(self, path: str | os.PathLike[str], *, namespace: str = "default") -> Path:
        """A kubeconfig pointing at this server (with the bearer token, if one is set), for code that
        calls ``kubernetes.config.load_kube_config``; JSON is valid YAML."""
        user: JSON = {"token": self.token} if self.token is not None else {}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "pdscale-test", "cluster": {"server": self.url}}],
            "users": [{"name": "pdscale-test", "user": user}],
            "contexts": [
                {
                    "name": "pdscale-test",
                    "context": {"cluster": "pdscale-test", "user": "pdscale-test", "namespace": namespace},
                }
            ],
            "current-context": "pdscale-test",
        }
        out = Path(path)
        out.write_text(json.dumps(config, indent=2))
        return out

    # -- seeding and inspection ------------------------------------------------------------------

    def add_deployment(
        self,
        namespace: str,
        name: str,
        *,
        replicas: int = 1,
        labels: Mapping[str, str] | None = None,
        match_labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        image: str = "vllm/vllm-openai:latest",
    ) -> JSON:
        """Create a Deployment directly in the store (as ``kubectl apply`` would have); return a copy."""
        selector = dict(match_labels or {"app": name})
        now = self._timestamp()
        obj: JSON = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "generation": 1,
                "creationTimestamp": now,
                "labels": dict(labels or selector),
                "annotations": dict(annotations or {}),
            },
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": dict(selector)},
                    "spec": {"containers": [{"name": "vllm", "image": image}]},
                },
                "strategy": {"type": "RollingUpdate"},
            },
            "status": {},
        }
        with self._lock:
            if (DEPLOYMENTS.resource, namespace, name) in self._objects:
                raise DEPLOYMENTS.already_exists(name)
            self._sync_status(obj)
            self._store(DEPLOYMENTS.resource, obj)
            return copy.deepcopy(obj)

    def deployment(self, namespace: str, name: str) -> JSON:
        """A copy of the stored Deployment (KeyError if absent)."""
        with self._lock:
            return copy.deepcopy(self._objects[(DEPLOYMENTS.resource, namespace, name)])

    def lease(self, namespace: str, name: str) -> JSON:
        """A copy of the stored Lease (KeyError if absent)."""
        with self._lock:
            return copy.deepcopy(self._objects[(LEASES.resource, namespace, name)])

    def set_ready_replicas(self, namespace: str, name: str, ready: int) -> None:
        """Model the Deployment controller: set status ready/available/updated replicas (bumps RV)."""
        with self._lock:
            obj = self._objects[(DEPLOYMENTS.resource, namespace, name)]
            status = obj.setdefault("status", {})
            status.update(
                {
                    "replicas": max(ready, status.get("replicas", 0)),
                    "readyReplicas": ready,
                    "availableReplicas": ready,
                    "updatedReplicas": ready,
                }
            )
            self._bump(obj)

    @property
    def requests(self) -> tuple[RecordedRequest, ...]:
        with self._lock:
            return tuple(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    # -- fault injection -------------------------------------------------------------------------

    def inject_status(self, path: str, code: int, *, count: int = 1, method: str | None = None) -> None:
        """The next ``count`` requests whose path matches ``path`` (fnmatch) answer ``code`` with a Status."""
        with self._lock:
            self._faults.append(_Fault(path, method, count, status=code))

    def inject_hang(self, path: str, seconds: float, *, count: int = 1, method: str | None = None) -> None:
        """The next ``count`` matching requests wait ``seconds`` before being served (client timeouts)."""
        with self._lock:
            self._faults.append(_Fault(path, method, count, hang_s=seconds))

    def _take_fault(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path):
                    fault.remaining -= 1
                    return fault
        return None

    # -- store -----------------------------------------------------------------------------------

    def _timestamp(self) -> str:
        return datetime.fromtimestamp(self._clock(), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _bump(self, obj: JSON) -> None:
        self._revision += 1
        obj["metadata"]["resourceVersion"] = str(self._revision)

    def _store(self, resource: str, obj: JSON) -> None:
        self._bump(obj)
        meta = obj["metadata"]
        self._objects[(resource, meta["namespace"], meta["name"])] = obj

    def _sync_status(self, deployment: JSON) -> None:
        status = deployment.setdefault("status", {})
        status["observedGeneration"] = deployment["metadata"]["generation"]
        if self.status_follows_spec:
            n = deployment["spec"]["replicas"]
            status.update({"replicas": n, "readyReplicas": n, "availableReplicas": n, "updatedReplicas": n})

    def _get(self, kind: _Kind, namespace: str, name: str) -> JSON:
        obj = self._objects.get((kind.resource, namespace, name))
        if obj is None:
            raise kind.not_found(name)
        return obj

    # -- authorization ---------------------------------------------------------------------------

    def allowed(self, attrs: Mapping[str, str]) -> bool:
        """Whether the allow-list permits these resource attributes (everything when there is none)."""
        if self.access_rules is None:
            return True
        return any(rule.allows(attrs) for rule in self.access_rules)

    def _authorize(self, method: str, route: _Route, query: Mapping[str, tuple[str, ...]]) -> None:
        if not self.enforce_rbac or route.kind in ("ssar", "version"):
            return
        kind = LEASES if route.kind.startswith("lease") else DEPLOYMENTS
        verb = _VERBS.get(method, method.lower())
        if route.kind in ("deployments", "leases") and method == "GET":
            verb = "watch" if query.get("watch", ("",))[0] in ("true", "1") else "list"
        attrs = {
            "verb": verb,
            "group": kind.group,
            "resource": kind.resource,
            "subresource": "scale" if route.kind == "scale" else "",
            "namespace": route.namespace,
            "name": route.name,
        }
        if self.allowed(attrs):
            return
        resource = kind.resource + ("/scale" if attrs["subresource"] else "")
        scope = f' in the namespace "{route.namespace}"' if route.namespace else " at the cluster scope"
        subject = f'{kind.qualified} "{route.name}"' if route.name else kind.qualified
        raise ApiError(
            403,
            f'{subject} is forbidden: User "{self.user}" cannot {verb} resource "{resource}" '
            f'in API group "{kind.group}"{scope}',
            details={"name": route.name, "group": kind.group, "kind": kind.resource},
        )

    # -- request handling (called from the HTTP handler) -----------------------------------------

    def handle(
        self, method: str, raw_path: str, headers: Mapping[str, str], body_bytes: bytes
    ) -> tuple[int, JSON, dict[str, str]]:
        """Answer one request: (status code, JSON body, extra headers)."""
        split = urllib.parse.urlsplit(raw_path)
        path = split.path
        query = {k: tuple(v) for k, v in urllib.parse.parse_qs(split.query, keep_blank_values=True).items()}
        content_type = headers.get("content-type")
        body = _parse_body(body_bytes)
        with self._lock:
            self._requests.append(RecordedRequest(method, path, query, content_type, body, dict(headers)))
        try:
            self._check_token(headers)
            fault = self._take_fault(method, path)
            if fault is not None and fault.hang_s > 0 and self._stopping.wait(fault.hang_s):
                raise ApiError(503, "the test API server is shutting down")
            if fault is not None and fault.status is not None:
                raise _injected(fault.status, path)
            route = _route(path)
            self._authorize(method, route, query)
            code, out = self._dispatch(method, route, query, content_type, body)
            return code, out, {}
        except ApiError as err:
            extra = {"Retry-After": "1"} if err.code == 429 else {}
            return err.code, err.status_body(), extra

    def _check_token(self, headers: Mapping[str, str]) -> None:
        if self.token is None:
            return
        if headers.get("authorization", "") != f"Bearer {self.token}":
            raise ApiError(401, "Unauthorized")

    def _dispatch(
        self,
        method: str,
        route: _Route,
        query: Mapping[str, tuple[str, ...]],
        content_type: str | None,
        body: Any,
    ) -> tuple[int, JSON]:
        if query.get("watch", ("",))[0] in ("true", "1"):
            raise ApiError(400, "watch is not implemented by the pdscale test API server")
        dry_run = bool(query.get("dryRun"))
        handlers: dict[tuple[str, str], Callable[[], tuple[int, JSON]]] = {
            ("version", "GET"): lambda: (200, dict(SERVER_VERSION)),
            ("deployments", "GET"): lambda: (200, self._list_deployments(route.namespace, query)),
            ("deployment", "GET"): lambda: (200, self._read(DEPLOYMENTS, route)),
            ("deployment", "PATCH"): lambda: (
                200,
                self._patch_deployment(route, content_type, body, dry_run),
            ),
            ("scale", "GET"): lambda: (200, self._read_scale(route)),
            ("scale", "PUT"): lambda: (200, self._write_scale(route, _require_object(body), dry_run)),
            ("scale", "PATCH"): lambda: (200, self._patch_scale(route, content_type, body, dry_run)),
            ("leases", "POST"): lambda: (201, self._create_lease(route, _require_object(body), dry_run)),
            ("lease", "GET"): lambda: (200, self._read(LEASES, route)),
            ("lease", "PUT"): lambda: (200, self._replace_lease(route, _require_object(body), dry_run)),
            ("lease", "DELETE"): lambda: (200, self._delete_lease(route, dry_run)),
            ("ssar", "POST"): lambda: (201, self._ssar(_require_object(body))),
        }
        handler = handlers.get((route.kind, method))
        if handler is None:
            raise ApiError(405, f"{method} is not supported on this path by the pdscale test API server")
        with self._lock:
            return handler()

    # -- deployments and scale -------------------------------------------------------------------

    def _read(self, kind: _Kind, route: _Route) -> JSON:
        return copy.deepcopy(self._get(kind, route.namespace, route.name))

    def _list_deployments(self, namespace: str, query: Mapping[str, tuple[str, ...]]) -> JSON:
        selector = query.get("labelSelector", ("",))[0]
        match = parse_label_selector(selector)
        items = []
        for (resource, ns, _), obj in sorted(self._objects.items()):
            if resource != DEPLOYMENTS.resource or (namespace and ns != namespace):
                continue
            if match(obj["metadata"].get("labels", {})):
                item = copy.deepcopy(obj)
                item.pop("apiVersion", None)  # list items carry no kind/apiVersion on the wire
                item.pop("kind", None)
                items.append(item)
        return {
            "kind": "DeploymentList",
            "apiVersion": "apps/v1",
            "metadata": {"resourceVersion": str(self._revision)},
            "items": items,
        }

    def _scale_of(self, dep: JSON) -> JSON:
        meta = dep["metadata"]
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
                "creationTimestamp": meta["creationTimestamp"],
            },
            "spec": {"replicas": dep["spec"]["replicas"]},
            "status": {
                "replicas": dep.get("status", {}).get("replicas", 0),
                "selector": selector_string(dep["spec"]["selector"].get("matchLabels", {})),
            },
        }

    def _read_scale(self, route: _Route) -> JSON:
        return self._scale_of(self._get(DEPLOYMENTS, route.namespace, route.name))

    def _patch_scale(self, route: _Route, content_type: str | None, body: Any, dry_run: bool) -> JSON:
        dep = self._get(DEPLOYMENTS, route.namespace, route.name)
        patched = _apply_patch(self._scale_of(dep), content_type, body)
        return self._write_scale(route, patched, dry_run)

    def _write_scale(self, route: _Route, scale: JSON, dry_run: bool) -> JSON:
        dep = self._get(DEPLOYMENTS, route.namespace, route.name)
        self._check_resource_version(DEPLOYMENTS, route.name, dep, scale, required=False)
        replicas = scale.get("spec", {}).get("replicas", 0)
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise invalid("Scale", "autoscaling", route.name, "spec.replicas", replicas, "must be an integer")
        if replicas < 0:
            raise invalid(
                "Scale",
                "autoscaling",
                route.name,
                "spec.replicas",
                replicas,
                "must be greater than or equal to 0",
            )
        if replicas != dep["spec"]["replicas"] and not dry_run:
            dep["spec"]["replicas"] = replicas
            dep["metadata"]["generation"] += 1
            self._sync_status(dep)
            self._bump(dep)
        elif dry_run:
            preview = copy.deepcopy(dep)
            preview["spec"]["replicas"] = replicas
            return self._scale_of(preview)
        return self._scale_of(dep)

    def _patch_deployment(self, route: _Route, content_type: str | None, body: Any, dry_run: bool) -> JSON:
        dep = self._get(DEPLOYMENTS, route.namespace, route.name)
        patched = _apply_patch(dep, content_type, body)
        self._check_resource_version(DEPLOYMENTS, route.name, dep, patched, required=False)
        replicas = patched.get("spec", {}).get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise invalid(
                "Deployment",
                "apps",
                route.name,
                "spec.replicas",
                replicas,
                "must be greater than or equal to 0",
            )
        meta_new, meta_old = patched["metadata"], dep["metadata"]
        for immutable in ("name", "namespace", "uid", "creationTimestamp"):
            if meta_new.get(immutable) != meta_old.get(immutable):
                raise invalid(
                    "Deployment",
                    "apps",
                    route.name,
                    f"metadata.{immutable}",
                    meta_new.get(immutable),
                    "field is immutable",
                )
        patched["metadata"]["resourceVersion"] = meta_old["resourceVersion"]
        patched["status"] = dep.get("status", {})
        if patched == dep or dry_run:
            return copy.deepcopy(patched)
        if patched["spec"] != dep["spec"]:
            patched["metadata"]["generation"] = meta_old["generation"] + 1
        self._sync_status(patched)
        self._store(DEPLOYMENTS.resource, patched)
        return copy.deepcopy(patched)

    def _check_resource_version(
        self, kind: _Kind, name: str, current: JSON, new: JSON, *, required: bool
    ) -> None:
        given = new.get("metadata", {}).get("resourceVersion")
        if not given:
            if required:
                raise invalid(
                    kind.resource.rstrip("s").capitalize(),
                    kind.group,
                    name,
                    "metadata.resourceVersion",
                    0,
                    "must be specified for an update",
                )
            return
        if given != current["metadata"]["resourceVersion"]:
            raise kind.conflict(name)

    # -- leases ----------------------------------------------------------------------------------

    def _create_lease(self, route: _Route, body: JSON, dry_run: bool) -> JSON:
        meta = body.get("metadata") or {}
        name = meta.get("name", "")
        if not name:
            raise invalid(
                "Lease", "coordination.k8s.io", "", "metadata.name", "", "name or generateName is required"
            )
        ns = meta.get("namespace") or route.namespace
        if ns != route.namespace:
            raise ApiError(
                400, "the namespace of the provided object does not match the namespace sent on the request"
            )
        if (LEASES.resource, ns, name) in self._objects:
            raise LEASES.already_exists(name)
        if meta.get("resourceVersion"):
            raise ApiError(500, "resourceVersion should not be set on objects to be created")
        lease = self._lease_object(body, ns, name, uid=str(uuid.uuid4()), created=self._timestamp())
        if dry_run:
            return lease
        self._store(LEASES.resource, lease)
        return copy.deepcopy(lease)

    def _replace_lease(self, route: _Route, body: JSON, dry_run: bool) -> JSON:
        current = self._get(LEASES, route.namespace, route.name)
        if (body.get("metadata") or {}).get("name", route.name) != route.name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        self._check_resource_version(LEASES, route.name, current, body, required=True)
        meta = current["metadata"]
        lease = self._lease_object(
            body, route.namespace, route.name, uid=meta["uid"], created=meta["creationTimestamp"]
        )
        lease["metadata"]["resourceVersion"] = meta["resourceVersion"]
        if lease == current or dry_run:
            return copy.deepcopy(lease)
        self._store(LEASES.resource, lease)
        return copy.deepcopy(lease)

    def _lease_object(self, body: JSON, ns: str, name: str, *, uid: str, created: str) -> JSON:
        spec = dict(body.get("spec") or {})
        duration = spec.get("leaseDurationSeconds")
        if duration is not None and (not isinstance(duration, int) or duration <= 0):
            raise invalid(
                "Lease",
                "coordination.k8s.io",
                name,
                "spec.leaseDurationSeconds",
                duration,
                "must be greater than 0",
            )
        meta_in = body.get("metadata") or {}
        metadata: JSON = {"name": name, "namespace": ns, "uid": uid, "creationTimestamp": created}
        for key in ("labels", "annotations"):
            if meta_in.get(key):
                metadata[key] = dict(meta_in[key])
        return {"kind": "Lease", "apiVersion": "coordination.k8s.io/v1", "metadata": metadata, "spec": spec}

    def _delete_lease(self, route: _Route, dry_run: bool) -> JSON:
        lease = self._get(LEASES, route.namespace, route.name)
        if not dry_run:
            del self._objects[(LEASES.resource, route.namespace, route.name)]
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": route.name,
                "group": LEASES.group,
                "kind": LEASES.resource,
                "uid": lease["metadata"]["uid"],
            },
        }

    # -- access review ---------------------------------------------------------------------------

    def _ssar(self, body: JSON) -> JSON:
        spec = body.get("spec") or {}
        attrs = spec.get("resourceAttributes")
        if not isinstance(attrs, dict):
            raise invalid(
                "SelfSubjectAccessReview",
                "authorization.k8s.io",
                "",
                "spec.resourceAttributes",
                None,
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )
        allowed = self.allowed({k: str(v) for k, v in attrs.items() if v is not None})
        status: JSON = {"allowed": allowed}
        if allowed:
            status["reason"] = "allowed by the pdscale test API server's access rules"
        return {
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }


def _parse_body(raw: bytes) -> Any:
    if not raw:
        return None
    text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _require_object(body: Any) -> JSON:
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _apply_patch(current: JSON, content_type: str | None, body: Any) -> JSON:
    media = (content_type or "").split(";")[0].strip().lower()
    if isinstance(body, str):
        raise ApiError(400, "the patch body is not valid JSON")
    if media == CT_JSON_PATCH:
        patched = json_patch(current, body)
    elif media in (CT_MERGE, CT_STRATEGIC):
        if not isinstance(body, dict):
            raise ApiError(400, f"a {media} body must be a JSON object")
        if media == CT_STRATEGIC and _contains_list(body):
            raise ApiError(
                415,
                "strategic-merge patches containing lists are not implemented by the pdscale test API server",
            )
        patched = merge_patch(current, body)
    elif media == CT_APPLY:
        raise ApiError(415, "server-side apply is not implemented by the pdscale test API server")
    else:
        raise ApiError(
            415,
            f"the body of the request was in an unknown format - accepted media types include: "
            f"{CT_JSON_PATCH}, {CT_MERGE}, {CT_APPLY}, {CT_STRATEGIC}",
        )
    if not isinstance(patched, dict):
        raise ApiError(422, "the patched object is not a JSON object")
    return patched


def _injected(code: int, path: str) -> ApiError:
    if code == 409:
        name = path.rstrip("/").split("/")[-1]
        kind = LEASES if "/leases/" in path else DEPLOYMENTS
        if name == "scale":
            name = path.rstrip("/").split("/")[-2]
        return kind.conflict(name)
    message = {
        500: "Internal error occurred: injected fault",
        503: "the server is currently unable to handle the request (injected fault)",
        429: "the server has received too many requests and has asked us to try again later",
        504: "the server was unable to return a response in the time allotted (injected fault)",
    }.get(code, f"injected fault {code}")
    return ApiError(
        code, message, details={"causes": [{"message": "injected by the test"}]} if code == 500 else None
    )


def _make_handler(api: FakeKubeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body in one buffered write, sent without Nagle's delay: otherwise a keep-alive client's
        # delayed ACK adds ~40 ms to every request.
        wbufsize = -1
        disable_nagle_algorithm = True

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            code, body, extra = api.handle(self.command, self.path, headers, raw)
            data = json.dumps(body).encode()
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Audit-Id", str(uuid.uuid4()))
                for key, value in extra.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test): nothing to answer

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        def log_message(self, format: str, *args: object) -> None:  # the stdlib's signature
            return

    return Handler
