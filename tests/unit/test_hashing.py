"""Canonical JSON and the sha256 hashes built on it (inputHash, proposalHash, outcomeHash)."""

from __future__ import annotations

import decimal
import hashlib
import json
import math
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runcontrol.domain import canonical_hash, canonical_json, errors
from runcontrol.domain.hashing import HASH_PREFIX, is_hash

# A fixed document (the spec's example submission, with non-ASCII text and awkward numbers).
PINNED_DOCUMENT = {
    "workflowId": "repository-assessment",
    "releaseAlias": "latest",
    "modelProfileId": "code-agent",
    "input": {
        "repository": "ConnectSoft.CaseManagement",
        "revision": "a1b2c3d",
        "note": "Zürich ✓ 東京",
    },
    "limits": {"maxCostUsd": 12.0, "maxMinutes": 45},
    "tags": ["a", None, True, False, 1.5, -0.0, 10**20],
}
PINNED_JSON = (
    '{"input":{"note":"Zürich ✓ 東京","repository":"ConnectSoft.CaseManagement",'
    '"revision":"a1b2c3d"},"limits":{"maxCostUsd":12,"maxMinutes":45},'
    '"modelProfileId":"code-agent","releaseAlias":"latest",'
    '"tags":["a",null,true,false,1.5,0,100000000000000000000],'
    '"workflowId":"repository-assessment"}'
)
PINNED_HASH = "sha256:f15930ccc1d797145cf45bec1726c21676d1d826ba4f31980088326e80979d9f"


# ---------------------------------------------------------------------------- strategies

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


def reference_normalise(value: Any) -> Any:
    """What canonical JSON promises: integral floats below 2**53 become integers."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: reference_normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [reference_normalise(v) for v in value]
    return value


def strictly_equal(a: Any, b: Any) -> bool:
    """Equality that also distinguishes bool/int/float (Python says True == 1 == 1.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(strictly_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(strictly_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def shuffled(value: Any, rng: random.Random) -> Any:
    """The same JSON value with every object's insertion order shuffled, recursively."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


# ---------------------------------------------------------------------------- pinned


def test_pinned_document_has_a_stable_canonical_form_and_digest():
    assert canonical_json(PINNED_DOCUMENT) == PINNED_JSON.encode("utf-8")
    assert canonical_hash(PINNED_DOCUMENT) == PINNED_HASH
    assert PINNED_HASH == HASH_PREFIX + hashlib.sha256(PINNED_JSON.encode("utf-8")).hexdigest()


def test_hash_format():
    digest = canonical_hash({"a": 1})
    assert digest.startswith("sha256:")
    assert len(digest) == len("sha256:") + 64
    assert is_hash(digest)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "sha256:",
        "sha256:" + "0" * 63,
        "sha256:" + "0" * 65,
        "sha256:" + "A" * 64,  # upper-case hex is not canonical
        "sha256:" + "g" * 64,
        "md5:" + "0" * 64,
        "0" * 64,
        " sha256:" + "0" * 64,
    ],
)
def test_is_hash_rejects_non_canonical_strings(value):
    assert not is_hash(value)


# ---------------------------------------------------------------------------- form


def test_key_order_does_not_matter():
    a = {"b": 1, "a": {"y": [1, 2], "x": None}}
    b = {"a": {"x": None, "y": [1, 2]}, "b": 1}
    assert canonical_json(a) == canonical_json(b) == b'{"a":{"x":null,"y":[1,2]},"b":1}'
    assert canonical_hash(a) == canonical_hash(b)


def test_keys_sort_by_code_point():
    assert canonical_json({"b": 0, "é": 0, "B": 0, "a": 0, "_": 0}) == (
        '{"B":0,"_":0,"a":0,"b":0,"é":0}'.encode()
    )


def test_non_ascii_is_written_as_utf8_not_escaped():
    out = canonical_json({"città": "Zürich ✓ 東京 🚀"})
    assert out == '{"città":"Zürich ✓ 東京 🚀"}'.encode()
    assert b"\\u" not in out
    assert out.decode("utf-8") == '{"città":"Zürich ✓ 東京 🚀"}'


def test_control_characters_are_escaped():
    assert canonical_json('a"\\\n\t\x01') == b'"a\\"\\\\\\n\\t\\u0001"'


def test_no_insignificant_whitespace():
    assert canonical_json({"a": [1, {"b": 2}], "c": "d e"}) == b'{"a":[1,{"b":2}],"c":"d e"}'


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (12, 12.0),
        ({"n": 12}, {"n": 12.0}),
        ([0], [-0.0]),
        ({"x": [1.0, 2.0]}, {"x": [1, 2]}),
        (-(2**52), -(2.0**52)),
    ],
)
def test_integral_floats_hash_like_integers(left, right):
    assert canonical_json(left) == canonical_json(right)
    assert canonical_hash(left) == canonical_hash(right)


def test_fractional_floats_use_the_shortest_round_trip_form():
    assert canonical_json(0.1) == b"0.1"
    assert canonical_json(1.5) == b"1.5"
    assert canonical_json(1e-7) == b"1e-07"
    assert json.loads(canonical_json(0.1 + 0.2)) == 0.1 + 0.2


def test_booleans_are_not_numbers():
    assert canonical_json(True) == b"true"
    assert canonical_hash([True]) != canonical_hash([1])
    assert canonical_hash({"a": False}) != canonical_hash({"a": 0})


def test_tuples_are_arrays():
    assert canonical_json({"a": (1, "x")}) == canonical_json({"a": [1, "x"]}) == b'{"a":[1,"x"]}'


def test_distinct_documents_hash_differently():
    assert canonical_hash({"a": 1}) != canonical_hash({"a": 2})
    assert canonical_hash({"a": "1"}) != canonical_hash({"a": 1})
    assert canonical_hash([1, 2]) != canonical_hash([2, 1])
    assert canonical_hash(None) != canonical_hash("")


# ---------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("wrap", ["bare", "in-object", "in-array"])
def test_nan_and_infinity_are_rejected(bad, wrap):
    value = {"bare": bad, "in-object": {"limits": {"max": bad}}, "in-array": [1, [bad]]}[wrap]
    with pytest.raises(errors.ValidationFailed) as info:
        canonical_json(value)
    assert "NaN and Infinity" in str(info.value)
    if wrap == "in-object":
        assert "limits.max" in str(info.value)
    if wrap == "in-array":
        assert "[1][0]" in str(info.value)
    with pytest.raises(errors.ValidationFailed):
        canonical_hash(value)


@pytest.mark.parametrize("key", [1, 1.5, None, True, ("a",)])
def test_non_string_keys_are_rejected(key):
    with pytest.raises(errors.ValidationFailed, match="keys must be strings"):
        canonical_json({key: "v"})
    with pytest.raises(errors.ValidationFailed, match="keys must be strings"):
        canonical_hash({"outer": {key: "v"}})


@pytest.mark.parametrize(
    "value",
    [b"bytes", {1, 2}, decimal.Decimal("1.5"), object(), complex(1, 2), frozenset()],
)
def test_non_json_types_are_rejected(value):
    with pytest.raises(errors.ValidationFailed, match="is not JSON"):
        canonical_json({"x": [value]})


@pytest.mark.parametrize("text", ["\ud800", "ok\udfffok"])
def test_lone_surrogates_are_rejected_as_validation_failures(text):
    # A lone surrogate has no UTF-8 form; json.loads can produce one from "\ud800".
    with pytest.raises(errors.ValidationFailed):
        canonical_json({"input": text})
    with pytest.raises(errors.ValidationFailed):
        canonical_hash({text: 1})


def test_refusal_is_a_typed_validation_error_not_a_crash():
    with pytest.raises(errors.ValidationFailed) as info:
        canonical_hash({"a": {"b": [math.nan]}})
    assert info.value.code == "validation-failed"


# ---------------------------------------------------------------------------- properties


@given(json_values)
def test_canonical_json_round_trips_to_the_normalised_value(value):
    encoded = canonical_json(value)
    decoded = json.loads(encoded.decode("utf-8"))
    assert strictly_equal(decoded, reference_normalise(value))
    # Canonical form is a fixpoint: re-canonicalising the decoded value changes nothing.
    assert canonical_json(decoded) == encoded
    assert canonical_hash(decoded) == canonical_hash(value)


@given(json_values, st.randoms(use_true_random=False))
def test_hash_is_independent_of_key_insertion_order(value, rng):
    assert canonical_json(shuffled(value, rng)) == canonical_json(value)


@given(st.dictionaries(st.text(max_size=6), json_scalars, max_size=8))
def test_output_is_compact_sorted_utf8(value):
    encoded = canonical_json(value)
    text = encoded.decode("utf-8")  # valid UTF-8
    assert text == json.dumps(
        reference_normalise(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    assert list(json.loads(text)) == sorted(value)
