"""docs/API.md matches the server: every documented metric and /v1/models field is served, and
everything served is documented (a live tiny server)."""
import re
from pathlib import Path

import httpx
import pytest

from tensorfold_bench.servers.launcher import launch

DOC = (Path(__file__).resolve().parents[2] / "docs" / "API.md").read_text()


def documented_metrics() -> dict[str, str]:
    """{name: type} from the doc's metric table rows: | `tfengine_x` | gauge | ... |"""
    rows = re.findall(r"^\s*\| `(tfengine_\w+)` \| (\w+) \|", DOC, flags=re.M)
    assert rows, "no metric table in docs/API.md"
    return dict(rows)


def documented_model_fields() -> set[str]:
    line = next(ln for ln in DOC.splitlines() if ln.startswith("- `GET /v1/models`"))
    entry = re.search(r'"data": \[\{(.*?)\}\]', line)
    assert entry, line
    return set(re.findall(r'"(\w+)":', entry.group(1)))


def served_metrics(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with launch(["--model", "tiny", "--parallel", "2", "--max-model-len", "256"],
                tmp_path_factory.mktemp("doc") / "server.log") as srv:
        yield srv.url


def test_metrics_table_equals_the_served_metrics(server):
    text = httpx.get(server + "/metrics").text
    served = served_metrics(text)
    assert len(served) == len(re.findall(r"^tfengine_\w+ \S+$", text, flags=re.M))  # every sample typed
    assert documented_metrics() == served


def test_models_fields_equal_the_served_fields(server):
    entry = httpx.get(server + "/v1/models").json()["data"][0]
    assert documented_model_fields() == set(entry)


def test_the_parsers_see_a_difference():
    """The comparison can fail: a served metric or field the doc lacks is noticed."""
    assert "tfengine_nosuch_total" not in documented_metrics()
    assert {"id", "object", "vocab_size"} <= documented_model_fields()
    assert served_metrics("# TYPE tfengine_x gauge\ntfengine_x 1\n") == {"tfengine_x": "gauge"}
