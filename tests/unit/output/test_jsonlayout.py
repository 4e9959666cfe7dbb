"""The JSON files' layout (`jsondoc.layout`): the same document json would write, a member a line down to three
levels and anything deeper on one line."""

from __future__ import annotations

import json

import pytest

from heapwalk.output.jsondoc import LAID_OUT, dump, layout

DOCUMENTS = [{}, [], "x", 3, None, {"a": []}, [1, {"b": {"c": [1, 2, {"d": 1}]}}],
             {7: {2: {3: {4: 5}}}, True: [None, False], None: 1.5, 2.5: "\u00e9\n\""},
             {"arenas": [{"bins": {"small": [{"index": 2, "chunks": list(range(50))}]}, "top": 7}]}]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_the_layout_is_the_document_json_writes(document):
    text = "".join(layout(document))
    assert json.loads(text) == json.loads(json.dumps(document))


def test_members_have_a_line_each_down_to_three_levels_and_no_deeper(tmp_path):
    document = {"arenas": [{"bins": {"small": [{"index": 2, "chunks": [16, 32]}]}, "top": 7}], "count": 1}
    dump(document, str(tmp_path / "doc.json"))
    lines = (tmp_path / "doc.json").read_text().splitlines()
    assert lines == ["{", ' "arenas": [', "  {",
                     '   "bins": ' + json.dumps(document["arenas"][0]["bins"]) + ",", '   "top": 7', "  }", " ],",
                     ' "count": 1', "}"]
    assert LAID_OUT == 3
