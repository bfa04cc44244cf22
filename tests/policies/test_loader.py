"""Policy files: the shipped default loads; every mistake is named by file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.loader import PolicyError, load_policy, parse_policy

GOOD = """\
version: 1
routes:
  - model: smollm2-135m
    local:
      target: embedded
      drafters: [grammar, ngram]
      speculative: {enabled: true, max_draft_tokens: 6, draft_tree: false}
      constraints: {backend: xgrammar, compile_timeout_s: 5}
  - model: remote-model
    upstream: {litellm_model: openai/some-model, api_base: "http://127.0.0.1:9000/v1", api_key_env: UPSTREAM_KEY}
"""


def test_the_shipped_default_policy_loads() -> None:
    policy = load_policy()
    route = policy.route("smollm2-135m")
    assert route is not None and route.local is not None
    assert route.local.speculative.enabled and route.local.constraints.backend == "outlines"
    assert route.local.speculative.draft_tree
    assert route.local.constraints.bounds is not None


def test_a_full_policy_parses_with_types_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(GOOD)
    policy = load_policy(path)
    local = policy.routes[0].local
    assert local is not None and local.speculative.max_draft_tokens == 6 and local.dtype == "auto"
    assert not local.speculative.draft_tree
    assert local.constraints.compile_timeout_s == 5.0 and local.constraints.bounds is None
    upstream = policy.routes[1].upstream
    assert upstream is not None and upstream.api_key_env == "UPSTREAM_KEY"
    assert policy.route("nope") is None


@pytest.mark.parametrize(("edit", "line", "key", "message"), [
    (("max_draft_tokens: 6", "max_draft_tokens: 6, eagerness: 3"), 7, "routes[0].local.speculative.eagerness",
     "unknown key"),
    (("max_draft_tokens: 6", "max_draft_tokens: lots"), 7, "routes[0].local.speculative.max_draft_tokens",
     "must be an int"),
    # a value a record's own check refuses is named by its own key and line, not the record's
    (("backend: xgrammar", "backend: regexes"), 8, "routes[0].local.constraints.backend", "backend must be one of"),
    (("compile_timeout_s: 5", "compile_timeout_s: -1"), 8, "routes[0].local.constraints.compile_timeout_s",
     "must be a finite number > 0, got -1.0"),
    (("compile_timeout_s: 5", "compile_timeout_s: 5,\n                    bounds: {items: 2, string_length: -3}"),
     9, "routes[0].local.constraints.bounds.string_length", "string_length must be >= 1, got -3"),
    (("drafters: [grammar, ngram]", "drafters: [grammar, magic]"), 6, "routes[0].local.drafters[1]",
     "unknown drafter 'magic'"),
    (("drafters: [grammar, ngram]", "drafters:\n        - ngram\n        - grammar\n        - ngram"), 9,
     "routes[0].local.drafters[2]", "drafter 'ngram' is listed twice"),
    (("compile_timeout_s: 5", "compile_timeout_s: .nan"), 8, "routes[0].local.constraints.compile_timeout_s",
     "must be a finite number > 0, got nan"),
    (("  - model: remote-model", "  - model: ''"), 9, "routes[1].model", "model must be a non-empty name"),
    (("target: embedded", "target: embedded\n      dtype: float99"), 6, "routes[0].local.dtype",
     "dtype must be one of auto, bf16"),
    (("target: embedded", "target: /nonexistent/model.gguf"), 5, "routes[0].local.target",
     "no such model file or directory"),
    (("version: 1", "version: 2"), 1, "version", "version 2 is not supported"),
    # a duplicate route is named at its second `model` line, with where the first one is
    (("  - model: remote-model\n", "  - model: smollm2-135m\n"), 9, "routes[1].model",
     "model 'smollm2-135m' is routed twice (first at routes[0])"),
    (("    upstream: {litellm_model: openai/some-model, ", "    upstream: {"), 10, "routes[1].upstream",
     "missing required key 'litellm_model'"),
    (("routes:", "routes: {}\nroutez:"), 2, "routes", "must be a list"),
    (("litellm_model: openai/some-model", "litellm_model: some-model"), 10, "routes[1].upstream.litellm_model",
     "litellm_model 'some-model' names no provider: write it as provider/model"),
    (('api_base: "http://127.0.0.1:9000/v1"', 'api_base: "127.0.0.1:9000/v1"'), 10, "routes[1].upstream.api_base",
     "api_base must be an http:// or https:// URL, got '127.0.0.1:9000/v1'"),  # (a trial's server started)
])
def test_mistakes_name_file_line_and_key(tmp_path: Path, edit: tuple[str, str], line: int, key: str,
                                         message: str) -> None:
    path = tmp_path / "bad.yaml"
    assert edit[0] in GOOD
    path.write_text(GOOD.replace(edit[0], edit[1], 1))
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    assert err.value.source == str(path) and err.value.line == line and err.value.key == key
    assert message in str(err.value) and f"{path}:{line}" in str(err.value)


def test_a_policy_without_routes_is_refused() -> None:
    with pytest.raises(PolicyError, match=r"empty\.yaml:2: routes: routes is empty: the gateway would serve no model"):
        parse_policy("version: 1\nroutes: []\n", "empty.yaml")


def test_a_key_that_is_no_name_is_named_by_its_line() -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy("version: 1\nroutes: []\n? [a]\n: 1\n3: x\n", "odd.yaml")
    lines = str(err.value).splitlines()
    assert lines[0] == "odd.yaml:2: routes: routes is empty: the gateway would serve no model"  # its own check
    assert lines[1] == "odd.yaml:3: a key must be a plain name, not a list or mapping"
    assert lines[2].startswith("odd.yaml:5: 3: unknown key (known here: version, routes")


def test_broken_yaml_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"^bad\.yaml:4: not valid YAML"):
        parse_policy("version: 1\nroutes:\n  - model: [unclosed\n", "bad.yaml")
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "missing.yaml")
    with pytest.raises(PolicyError, match="empty"):
        parse_policy("", "empty.yaml")


def test_every_mistake_in_a_file_is_named_at_once_in_the_files_order() -> None:
    """Three typos in three sections: one error, a line each, the first one's line and key on the error;
    a record with a mistake inside is not built, so its own checks (a required key) add nothing."""
    text = GOOD.replace("version: 1\n", "version: 1\nauth: {keyz: [sk-a]}\nserver: {max_queu: 3}\n")
    text = text.replace("      target: embedded\n", "      locl: embedded\n").replace(
        "    upstream: {litellm_model: openai/some-model, ", "    upstream: {")
    text = text.replace("max_draft_tokens: 6", "max_draft_tokens: many")
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "multi.yaml")
    lines = str(err.value).splitlines()
    assert [line.split(": ")[:2] for line in lines] == [
        ["multi.yaml:2", "auth.keyz"], ["multi.yaml:3", "server.max_queu"], ["multi.yaml:7", "routes[0].local.locl"],
        ["multi.yaml:9", "routes[0].local.speculative.max_draft_tokens"], ["multi.yaml:12", "routes[1].upstream"]]
    assert "unknown key (known here: keys, keys_env, dev)" in lines[0] and "must be an int" in lines[3]
    assert "missing required key 'litellm_model'" in lines[4]
    assert (err.value.line, err.value.key, len(err.value.more)) == (2, "auth.keyz", 4)


def test_a_records_other_checks_still_run_beside_a_mistake_inside_it() -> None:
    """A trial's file took four runs to fix: a typo inside `bounds` hid the backend's misspelling beside
    it, and a second mistake in a route hid an unknown drafter. (A check across records, a model routed
    twice, still waits for the records it compares to be whole.)"""
    text = """version: 1
server: {max_queu: 3}
routes:
  - model: a
    local:
      drafters: [ngram, eagle]
      dtype: bf17
      constraints: {backend: xgramar, bounds: {string_len: 10}}
"""
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "bad.yaml")
    lines = str(err.value).splitlines()
    assert [line.split(": ")[:2] for line in lines] == [
        ["bad.yaml:2", "server.max_queu"], ["bad.yaml:6", "routes[0].local.drafters[1]"],
        ["bad.yaml:7", "routes[0].local.dtype"], ["bad.yaml:8", "routes[0].local.constraints.bounds.string_len"],
        ["bad.yaml:8", "routes[0].local.constraints.backend"]]
    assert "unknown drafter 'eagle'" in lines[1] and "bf17" in lines[2] and "xgramar" in lines[4]


def test_server_and_auth_sections(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(GOOD.replace("version: 1\n", "version: 1\nauth: {keys: [sk-a], dev: false}\n"
                                                 "server: {max_queue: 3, request_timeout_s: 30}\n"))
    policy = load_policy(path)
    assert policy.auth.keys == ["sk-a"] and not policy.auth.dev and policy.auth.keys_env == "DRAFTGATE_API_KEYS"
    assert policy.server.max_queue == 3 and policy.server.request_timeout_s == 30.0
    assert load_policy().auth.dev  # the shipped policy is in dev mode


@pytest.mark.parametrize(("section", "key", "message"), [
    ("server: {max_queue: 0}", "server.max_queue", "max_queue must be >= 1"),
    ("server: {max_body_bytes: -5}", "server.max_body_bytes", "max_body_bytes must be >= 1"),
    ("server: {request_timeout_s: .nan}", "server.request_timeout_s", "must be a finite number > 0, got nan"),
    ("server: {request_timeout_s: .inf}", "server.request_timeout_s", "must be a finite number > 0, got inf"),
    ("server: {request_timeout: 5}", "server.request_timeout", "unknown key"),
    ("auth: {keys: sk-a}", "auth.keys", "must be a list"),
    ("auth: {dev: yes please}", "auth.dev", "must be a bool"),
])
def test_server_and_auth_mistakes_are_named(tmp_path: Path, section: str, key: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("version: 1\n", f"version: 1\n{section}\n"))
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    assert err.value.line == 2 and err.value.key == key and message in str(err.value)
