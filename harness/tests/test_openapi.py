"""The agent's API document (docs/api/openapi.json) against the OpenAPI
3.0 specification, and a running agent's answers against the document.

- The document validates against the OpenAPI 3.0 schema the OpenAPI
  Initiative publishes (tests/data/openapi-3.0-schema.json: its
  https://spec.openapis.org/oas/3.0/schema/2021-09-28, copied from
  OAI/OpenAPI-Specification at 1f0334d, schemas/v3.0/schema.json, Apache
  License 2.0), with Debian's python3-jsonschema; every $ref resolves and
  every path parameter is declared (what that schema cannot say); and it
  names exactly the routes and methods the agent's router serves
  (crates/cluster/src/agent/mod.rs).
- One etcd member and one `ftvm agent` on the site's primary host, asked
  from the client's: every GET path, a VM and a backup created and
  deleted, and refusals (401 without or with a wrong token on every path,
  404, 400 for bodies that are no JSON, no spec or too large, 409, 422).
  Each answer's status must be one the document gives for its path and
  method, its content type the document's, and its JSON body valid
  against the document's schema for that status. Strictly: an object may
  carry no field its schema does not name, and must carry every field it
  names (serde writes an absent Option as null), so a renamed, added or
  dropped field fails; the test shows the validator rejects such an
  answer before it trusts it.
"""

import copy
import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

try:
    import jsonschema
except ImportError:  # a missing tool fails the test (the suite never skips)
    jsonschema = None

from ftsite import REPO, Proc, Site, in_netns
from ftsite.etcd import EtcdCluster
from ftsite.pki import Pki
from ftsite.site import PRIMARY_HOST_IP

DOC = REPO / "docs" / "api" / "openapi.json"
OAS_SCHEMA = Path(__file__).parent / "data" / "openapi-3.0-schema.json"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
PORT = 7800


def need_jsonschema():
    if jsonschema is None:
        pytest.fail("python3-jsonschema is not installed (scripts/install-deps.sh installs it)", pytrace=False)


def load_doc():
    return json.loads(DOC.read_text())


def resolve(doc, ref):
    """The object a local $ref (#/a/b) names in `doc`; KeyError if none."""
    assert ref.startswith("#/"), f"a $ref outside the document: {ref}"
    node = doc
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def refs(node):
    """Every $ref in a JSON value."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield v
            else:
                yield from refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from refs(v)


def json_schema(doc, schema, strict, seen=()):
    """An OpenAPI 3.0 schema object as a JSON Schema (draft 4) with its
    $refs inlined: `nullable` becomes "or null". With `strict` (answers,
    not requests), an object schema that names its properties (and does
    not say additionalProperties itself) takes no others and requires
    every one it names."""
    if isinstance(schema, list):
        return [json_schema(doc, s, strict, seen) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref not in seen, f"a schema that contains itself: {ref}"
        return json_schema(doc, resolve(doc, ref), strict, seen + (ref,))
    out = {}
    for k, v in schema.items():
        if k in ("properties",):
            out[k] = {name: json_schema(doc, s, strict, seen) for name, s in v.items()}
        elif k in ("items", "allOf", "anyOf", "oneOf", "not", "additionalProperties"):
            out[k] = json_schema(doc, v, strict, seen)
        elif k in ("nullable", "example", "default", "description"):
            continue
        else:
            out[k] = copy.deepcopy(v)
    if strict and "properties" in out and "additionalProperties" not in schema:
        out["additionalProperties"] = False
        out["required"] = sorted(out["properties"])
    if schema.get("nullable"):
        out = {"anyOf": [{"type": "null"}, out]}
    return out


def router_routes():
    """{path: {method}} as the agent's router (agent/mod.rs, and the
    dashboard's routes it merges: dashboard.rs) serves them."""
    src = "".join((REPO / "crates" / "cluster" / "src" / f).read_text() for f in ("agent/mod.rs", "dashboard.rs"))
    routes = {}
    for path, handlers in re.findall(r'\.route\(\s*"([^"]+)",\s*(.*?)\)\s*\n', src):
        methods = set(re.findall(r"\b(get|post|put|delete|patch)\(", handlers))
        routes.setdefault(path, set()).update(methods)
    return routes


def test_the_document_is_an_openapi_3_document_of_the_agents_routes():
    need_jsonschema()
    doc = load_doc()
    oas = json.loads(OAS_SCHEMA.read_text())
    errors = sorted(jsonschema.Draft4Validator(oas).iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, "docs/api/openapi.json is not an OpenAPI 3.0 document:\n" + "\n".join(
        f"  at /{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:20])
    # The published schema checks shapes only: the references, the path
    # parameters and each schema's own validity are this test's.
    for ref in set(refs(doc)):
        try:
            resolve(doc, ref)
        except KeyError:
            pytest.fail(f"docs/api/openapi.json: $ref {ref} names nothing", pytrace=False)
    for name, schema in doc["components"]["schemas"].items():
        jsonschema.Draft4Validator.check_schema(json_schema(doc, schema, strict=False))
    for path, item in doc["paths"].items():
        wanted = set(re.findall(r"\{([^}]+)\}", path))
        for method in [m for m in METHODS if m in item]:
            declared = {p["name"] for p in item.get("parameters", []) + item[method].get("parameters", [])
                        if p.get("in") == "path"}
            assert declared == wanted, f"{method.upper()} {path}: path parameters {declared}, the path has {wanted}"
            assert item[method]["responses"], f"{method.upper()} {path}: no responses"
    documented = {path: {m for m in METHODS if m in item} for path, item in doc["paths"].items()}
    served = router_routes()
    served["/healthz"] = {"get"}
    assert served, "found no routes in agent/mod.rs: this test's reading of it is out of date"
    assert documented == served, f"the document's paths and methods {documented} are not the router's {served}"


class Api:
    """HTTP requests to the agent from the client's namespace; every answer
    is checked against the document (see the module's doc)."""

    def __init__(self, site, base, token, ssl_context):
        self.site, self.base, self.token, self.ssl = site, base, token, ssl_context
        self.doc = load_doc()
        self.checked = []  # (method, path template, status) of each answer checked

    def call(self, method, path, template=None, body=None, token=True, raw=None):
        """(status, content type, body text) of one request, checked."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if token is True:
            req.add_header("Authorization", f"Bearer {self.token}")
        elif token:
            req.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")

        def send():
            try:
                with urllib.request.urlopen(req, timeout=120, context=self.ssl) as r:
                    return r.status, r.headers.get("Content-Type", ""), r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.headers.get("Content-Type", ""), e.read().decode()

        status, ctype, text = in_netns(self.site.ns["client"], send)
        self.check(method, template or path, status, ctype, text)
        return status, ctype, text

    def schema_for(self, method, template, status, media_type=None):
        """(media type, JSON Schema or None) the document gives an answer
        (of `media_type`, where it gives more than one)."""
        op = self.doc["paths"].get(template, {}).get(method.lower())
        assert op is not None, f"the document has no {method} {template}"
        response = op["responses"].get(str(status))
        assert response is not None, (f"{method} {template} answered {status}, which the document does not give "
                                      f"(it gives {', '.join(op['responses'])})")
        content = response.get("content", {})
        if media_type in content and len(content) > 1:
            content = {media_type: content[media_type]}
        assert len(content) == 1, f"{method} {template} {status}: the document gives {len(content)} media types"
        media, spec = next(iter(content.items()))
        return media, json_schema(self.doc, spec["schema"], strict=True) if media == "application/json" else None

    def check(self, method, template, status, ctype, text):
        got = ctype.split(";")[0].strip()
        media, schema = self.schema_for(method, template, status, got)
        assert got == media, f"{method} {template} {status}: content type {ctype!r}, the document says {media}"
        if schema is not None:
            try:
                value = json.loads(text)
            except ValueError:
                pytest.fail(f"{method} {template} {status}: the body is not JSON: {text[:200]!r}", pytrace=False)
            errors = list(jsonschema.Draft4Validator(schema).iter_errors(value))
            assert not errors, f"{method} {template} {status}: the answer is not as documented:\n" + "\n".join(
                f"  at /{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:10]) + \
                f"\n  the answer: {text[:2000]}"
        self.checked.append((method, template, status))

    def json(self, method, path, template=None, body=None, expect=200, **kw):
        status, _, text = self.call(method, path, template, body, **kw)
        assert status == expect, f"{method} {path}: {status} ({text.strip()[:300]}), expected {expect}"
        return json.loads(text)

    def rejects(self, method, template, status, value):
        """Whether the document's schema refuses `value` as an answer."""
        _, schema = self.schema_for(method, template, status)
        return not jsonschema.Draft4Validator(schema).is_valid(value)


def wait_for(what, within, f):
    deadline = time.monotonic() + within
    while True:
        v = f()
        if v:
            return v
        assert time.monotonic() < deadline, f"{what} did not happen within {within} s"
        time.sleep(0.5)


def test_a_running_agent_answers_as_the_document_says(ftvm, scratch):
    need_jsonschema()
    site = Site("oa")
    pki = Pki(ftvm, scratch, ["primary"])
    etcd = EtcdCluster(site, scratch, roles=("primary",), pki=pki)
    token = pki.token
    agent = Proc("agent", site, "primary",
                 [ftvm, "agent", "--host-id", "oa-host", "--etcd", etcd.endpoints, "--address", PRIMARY_HOST_IP,
                  "--port", str(PORT), "--state-dir", str(scratch / "agent"), "--credentials", str(pki.host("primary"))],
                 scratch / "agent.log")
    api = Api(site, f"https://{PRIMARY_HOST_IP}:{PORT}", token, pki.ssl_context())

    def serving():
        agent.assert_running()
        try:
            return api.call("GET", "/healthz")[0] == 200
        except OSError:
            return False

    wait_for("the agent's API", 30, serving)

    host = api.json("GET", "/v1/host")
    assert host["id"] == "oa-host" and host["vms"] == []
    assert api.json("GET", "/v1/vms") == []
    # The validator bites: the host's own answer with a field renamed, one
    # added, one of another type, one dropped, is refused.
    for broken in ({**{k: v for k, v in host.items() if k != "free_memory_bytes"}, "free_memory": 1},
                   {**host, "extra": 1}, {**host, "cores": "2"},
                   {k: v for k, v in host.items() if k != "version"}):
        assert api.rejects("GET", "/v1/host", 200, broken), f"the document's HostRecord takes {broken}"

    # A VM (its guest need not boot for its status: the control socket
    # answers at once) and a backup waiting for its primary.
    spec = {"name": "oa-vm", "memory_mib": 256, "command": "sleep 600"}
    created = api.json("POST", "/v1/vms", body=spec, expect=201)
    assert created["name"] == "oa-vm" and created["spec"]["command"] == "sleep 600"
    started = api.json("POST", "/v1/backups", body={"spec": {"name": "oa-backup", "memory_mib": 256}}, expect=201)
    assert started["listen"].startswith(PRIMARY_HOST_IP + ":")
    # Both answer their control sockets, so their status is in the views.
    views = wait_for("both VMs' status", 60,
                     lambda: (v := api.json("GET", "/v1/vms")) and all(x["status"] for x in v) and v)
    assert sorted((v["name"], v["role"]) for v in views) == [("oa-backup", "backup"), ("oa-vm", "unprotected")]
    vm = api.json("GET", "/v1/vms/oa-vm", "/v1/vms/{name}")
    waiting = api.json("GET", "/v1/vms/oa-backup", "/v1/vms/{name}")
    assert "waiting" in waiting["status"]["state"], waiting["status"]
    broken = copy.deepcopy(vm)
    broken["status"]["icount"] = "many"
    assert api.rejects("GET", "/v1/vms/{name}", 200, broken), "the document's VmStatus takes a string icount"
    broken = copy.deepcopy(vm)
    broken["spec"]["memory"] = broken["spec"].pop("memory_mib")
    assert api.rejects("GET", "/v1/vms/{name}", 200, broken), "the document's VmSpec takes a renamed field"
    assert len(api.json("GET", "/v1/host")["vms"]) == 2
    status, _, text = api.call("GET", "/metrics")
    assert status == 200 and 'ftvm_vm_info{vm="oa-vm",role="unprotected",mode="none"} 1' in text, text

    # Refusals, each in the document's Error.
    def refused(method, path, template, status, kind, **kw):
        got = api.json(method, path, template, expect=status, **kw)
        assert got["error"] == kind, got

    for method, path, template, body in [("GET", "/v1/host", None, None), ("GET", "/v1/vms", None, None),
                                         ("POST", "/v1/vms", None, spec), ("GET", "/v1/vms/oa-vm", "/v1/vms/{name}", None),
                                         ("DELETE", "/v1/vms/oa-vm", "/v1/vms/{name}", None),
                                         ("POST", "/v1/vms/oa-vm/protect", "/v1/vms/{name}/protect", {"backup": "x"}),
                                         ("POST", "/v1/vms/oa-vm/unprotect", "/v1/vms/{name}/unprotect", None),
                                         ("POST", "/v1/vms/oa-vm/handover", "/v1/vms/{name}/handover", None),
                                         ("POST", "/v1/backups", None, {"spec": {"name": "x"}}),
                                         ("GET", "/v1/events?follow=false", "/v1/events", None),
                                         ("GET", "/v1/vms/oa-vm/console", "/v1/vms/{name}/console", None),
                                         ("GET", "/metrics", None, None)]:
        refused(method, path, template, 401, "unauthorized", body=body, token=None)
        refused(method, path, template, 401, "unauthorized", body=body, token="0123456789abcdef0123456789abcdef")
    for method, path, template in [("GET", "/v1/vms/nosuch", "/v1/vms/{name}"),
                                   ("DELETE", "/v1/vms/nosuch", "/v1/vms/{name}"),
                                   ("POST", "/v1/vms/nosuch/unprotect", "/v1/vms/{name}/unprotect"),
                                   ("POST", "/v1/vms/nosuch/handover", "/v1/vms/{name}/handover"),
                                   ("GET", "/v1/vms/nosuch/console", "/v1/vms/{name}/console")]:
        refused(method, path, template, 404, "not_found")
    refused("POST", "/v1/vms/nosuch/protect", "/v1/vms/{name}/protect", 404, "not_found",
            body={"backup": "10.201.0.2:7700", "mode": "checkpoint"})
    refused("POST", "/v1/vms", None, 400, "bad_request", raw=b"{not json")
    refused("POST", "/v1/vms", None, 400, "bad_request", body={"name": "a/b"})
    refused("POST", "/v1/vms", None, 400, "bad_request", body={"name": "x", "colour": "red"})
    refused("POST", "/v1/vms", None, 400, "bad_request", raw=json.dumps({"name": "x" * 70_000}).encode())
    refused("POST", "/v1/backups", None, 400, "bad_request", body={})
    # The console is a WebSocket (test_cluster_console speaks it).
    refused("GET", "/v1/vms/oa-vm/console", "/v1/vms/{name}/console", 400, "bad_request")
    refused("POST", "/v1/vms/oa-vm/protect", "/v1/vms/{name}/protect", 400, "bad_request",
            body={"backup": "10.201.0.2:7700", "mode": "mirror"})
    refused("POST", "/v1/vms", None, 409, "conflict", body=spec)
    # Forgetting a VM only if it has ended: it runs, so it is refused (and
    # still runs).
    refused("DELETE", "/v1/vms/oa-vm?ended_only=true", "/v1/vms/{name}", 409, "conflict")
    refused("DELETE", "/v1/vms/oa-vm?ended_only=perhaps", "/v1/vms/{name}", 400, "bad_request")
    assert api.json("GET", "/v1/vms/oa-vm", "/v1/vms/{name}")["role"] == "unprotected"
    refused("GET", "/v1/events?after=soon", "/v1/events", 400, "bad_request")
    # The event log as a list (this host's VMs did nothing a pair logs,
    # so it may be empty; test_cluster checks what a failover writes).
    assert isinstance(api.json("GET", "/v1/events?follow=false", "/v1/events"), list)
    # What the HTTP layer refuses before any handler (a path the API does
    # not have, a method a path does not take) is the same Error.
    for method, path, status, kind in [("GET", "/v1/nothing", 404, "not_found"), ("PUT", "/v1/host", 400, "bad_request")]:
        req = urllib.request.Request(api.base + path, method=method, headers={"Authorization": f"Bearer {token}"})

        def send():
            try:
                urllib.request.urlopen(req, timeout=30, context=api.ssl)
            except urllib.error.HTTPError as e:
                return e.code, e.headers.get("Content-Type", ""), e.read().decode()

        got = in_netns(site.ns["client"], send)
        assert got and got[0] == status and got[1].startswith("application/json"), f"{method} {path}: {got}"
        error = json_schema(api.doc, {"$ref": "#/components/schemas/Error"}, strict=True)
        assert jsonschema.Draft4Validator(error).is_valid(json.loads(got[2])), f"{method} {path}: {got}"
        assert json.loads(got[2])["error"] == kind, got
    refused("POST", "/v1/vms/oa-vm/unprotect", "/v1/vms/{name}/unprotect", 422, "refused")
    refused("POST", "/v1/vms/oa-vm/handover", "/v1/vms/{name}/handover", 422, "refused")

    # A protection that fails (toward the backup of another VM, which
    # holds another pair key) is in the cluster's event log, in the
    # document's form.
    status, _, text = api.call("POST", "/v1/vms/oa-vm/protect", "/v1/vms/{name}/protect",
                               body={"backup": started["listen"], "mode": "checkpoint"})
    print(f"protect toward another VM's backup: {status} {text.strip()[:200]}")
    logged = wait_for("the failed protection in the event log", 60,
                      lambda: api.json("GET", "/v1/events?follow=false&vm=oa-vm", "/v1/events"))
    assert all(e["vm"] == "oa-vm" and e["host"] == "oa-host" for e in logged), logged
    print("logged: " + ", ".join(e["what"]["event"]["event"] for e in logged if e["what"]["source"] == "pair"))

    for name in ("oa-backup", "oa-vm"):
        done = api.json("DELETE", f"/v1/vms/{name}", "/v1/vms/{name}")
        assert done["message"].startswith(f"VM {name} stopped"), done
    assert api.json("GET", "/v1/vms") == []
    statuses = sorted({s for *_, s in api.checked})
    print(f"{len(api.checked)} answers checked against the document, statuses {statuses}")
    assert statuses == [200, 201, 400, 401, 404, 409, 422]
