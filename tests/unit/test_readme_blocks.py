"""How the README tests read a README: blocks, markers, commands, and which test takes each."""

from __future__ import annotations

import pytest

from tests.support.readme import COMMANDS, SERVERS, kind_of, read_blocks, stray_markers

DOC = """\
# Title

```sh
make run     # starts everything
```

## Publishing

<!-- not run by tests: needs a cluster -->
```sh
kubectl apply -k deploy
```

<!-- not run by tests -->
```yaml
store:
  uri: s3://b/p
```

```sh
curl -s http://x/infer \\
  -d '{"a": 1}'
# -> "data":[2.0]
# a comment, not an expectation
export A=1
```

```console
$ controlplane status
example
  active: r1
```

<!-- not run by tests: nothing follows -->

Some text.
"""


def test_blocks_carry_language_section_and_marker() -> None:
    blocks = read_blocks(DOC)

    assert [(b.line, b.lang, b.section) for b in blocks] == [
        (3, "sh", "Title"),
        (10, "sh", "Publishing"),
        (15, "yaml", "Publishing"),
        (20, "sh", "Publishing"),
        (28, "console", "Publishing"),
    ]
    assert [b.marker for b in blocks] == [None, "needs a cluster", "", None, None]


def test_commands_join_continuations_and_keep_what_they_must_print() -> None:
    commands = read_blocks(DOC)[3].commands()

    assert [(c.line, c.text, c.expect) for c in commands] == [
        (21, "curl -s http://x/infer \\\n  -d '{\"a\": 1}'", ('"data":[2.0]',)),
        (25, "export A=1", ()),
    ]


def test_a_console_block_expects_the_lines_after_each_command() -> None:
    (command,) = read_blocks(DOC)[4].commands()

    assert command.text == "controlplane status"
    assert command.expect == ("example", "active: r1")


def test_a_marker_that_no_fence_follows_is_reported() -> None:
    assert stray_markers(DOC) == [34]


def test_an_unclosed_fence_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"README\.md:3: this fence is never closed"):
        read_blocks("# T\n\n```sh\nls\n")


@pytest.mark.parametrize(
    ("fence", "kind"),
    [
        ("sh\nmake run", SERVERS),
        ("sh\nexport X=1\ntritonserver --model-repository=/m", SERVERS),
        ("sh\nLD_PRELOAD=/lib.so tritonserver ...", SERVERS),
        ("bash\ncontrolplane deploy m r --wait", COMMANDS),
        ("yaml\nstore:\n  uri: file:///s", "settings"),
        ("yaml\nstore:\n  uri: file:///s\nrollbak:\n  threshold: 1", "settings"),  # typo: loads
        ("yaml\n- alert: X\n  expr: up == 0", "prometheus-rules"),
        ("yaml\nreceivers:\n  - name: r", "alertmanager"),
        ("yaml\n$patch: delete\nkind: K", "kustomize-patch"),
        ("yaml\njobs:\n  j:\n    steps: []", "github-actions"),
        ("yaml\ndeploy:\n  script: [ls]", "gitlab-ci"),
        ("json\n{}", "json"),
        ("text\nanything", "text"),
    ],
)
def test_each_block_goes_to_the_test_that_can_run_it(fence: str, kind: str) -> None:
    (block,) = read_blocks(f"```{fence}\n```\n")

    assert kind_of(block) == kind


@pytest.mark.parametrize("fence", ["\nls", "python\nprint()", "yaml\nunknown: 1"])
def test_a_block_no_test_can_take_is_unknown(fence: str) -> None:
    (block,) = read_blocks(f"```{fence}\n```\n")

    assert kind_of(block).startswith("unknown: ")
