"""Rename never captures: a new name that is used (declared or not) anywhere in the document is refused."""

from __future__ import annotations

import pytest
from lsp_client import Client, ServerError

TEXT = "steer 1\nparam a = 1\nparam b = ghost + a\n"


@pytest.fixture
def server(tmp_path):
    client = Client(cwd=str(tmp_path))
    client.initialize(encodings=["utf-32"])
    yield client, tmp_path
    client.kill()


def rename(client, uri: str, new: str):
    return client.request("textDocument/rename", {"textDocument": {"uri": uri},
                                                  "position": {"line": 1, "character": 6}, "newName": new})


def test_a_rename_onto_a_used_but_undeclared_name_is_refused(server):
    client, root = server
    uri = (root / "p.steer").as_uri()
    client.open(uri, TEXT)
    with pytest.raises(ServerError) as refused:
        rename(client, uri, "ghost")  # `ghost + a` would become `ghost + ghost`: the undefined use captured
    assert refused.value.code == -32803 and "used in this program but not declared" in refused.value.message
    for taken, why in (("b", "already declared"), ("param", "keyword"), ("1x", "is not a name")):
        with pytest.raises(ServerError, match=why):
            rename(client, uri, taken)
    edits = rename(client, uri, "fresh")["changes"][uri]
    assert sorted((e["range"]["start"]["line"], e["range"]["start"]["character"]) for e in edits) == [(1, 6), (2, 18)]
