"""A small JSON Schema validator for the end-to-end tests, written from the
JSON Schema specification (draft 2020-12 validation vocabulary) for the
keywords the tests use, independent of megactx's grammar compiler:

  type (one or a list; "integer" is any number without a fraction), enum,
  const, properties, required, additionalProperties (boolean or schema),
  items, prefixItems, minItems, maxItems, minLength, maxLength (in code
  points), pattern (unanchored search), format date (RFC 3339 full-date),
  minimum, maximum, exclusiveMinimum, exclusiveMaximum, anyOf, oneOf, allOf,
  $ref to "#" or "#/$defs/NAME".

errors(schema, value) returns what is wrong (empty: valid); a keyword outside
that list raises, so a schema the tests rely on is never half checked.
"""
import calendar
import re

KNOWN = {"type", "enum", "const", "properties", "required", "additionalProperties", "items",
         "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format",
         "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf",
         "$ref", "$defs", "title", "description"}


def json_type_of(value):
    # bool before int: in Python True is an int, in JSON it is not a number.
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise TypeError(f"not a JSON value: {value!r}")


def has_type(value, name):
    kind = json_type_of(value)
    if name == "integer":
        return kind == "number" and float(value).is_integer()
    return kind == name


def json_equal(a, b):
    """Equality of JSON values: 1 == 1.0, but true != 1."""
    ka, kb = json_type_of(a), json_type_of(b)
    if ka != kb:
        return False
    if ka == "array":
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if ka == "object":
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return a == b


def is_date(text):
    match = re.fullmatch(r"([0-9]{4})-([0-9]{2})-([0-9]{2})", text)
    if not match:
        return False
    year, month, day = (int(g) for g in match.groups())
    if not 1 <= month <= 12:
        return False
    # calendar.monthrange needs year >= 1; year 0 is a leap year (divisible by 400).
    length = calendar.monthrange(year if year else 2000, month)[1]
    return 1 <= day <= length


def errors(schema, value, root=None, path="$"):
    root = schema if root is None else root
    if schema is True:
        return []
    if schema is False:
        return [f"{path}: the schema is false"]
    unknown = set(schema) - KNOWN
    if unknown:
        raise ValueError(f"json_schema_check does not implement {sorted(unknown)}")
    out = []
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref == "#":
            target = root
        elif ref.startswith("#/$defs/"):
            target = root["$defs"][ref[len("#/$defs/"):]]
        else:
            raise ValueError(f"unsupported $ref {ref}")
        out += errors(target, value, root, path)
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(has_type(value, name) for name in names):
            return out + [f"{path}: {value!r} is not of type {names}"]
    if "enum" in schema and not any(json_equal(value, v) for v in schema["enum"]):
        out.append(f"{path}: {value!r} is not in enum {schema['enum']}")
    if "const" in schema and not json_equal(value, schema["const"]):
        out.append(f"{path}: {value!r} is not {schema['const']!r}")
    kind = json_type_of(value)
    if kind == "object":
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                out.append(f"{path}: required property {name!r} is missing")
        for name, item in value.items():
            if name in properties:
                out += errors(properties[name], item, root, f"{path}.{name}")
            elif "additionalProperties" in schema:
                out += errors(schema["additionalProperties"], item, root, f"{path}.{name}")
    if kind == "array":
        prefix = schema.get("prefixItems", [])
        for i, item in enumerate(value):
            sub = prefix[i] if i < len(prefix) else schema.get("items", True)
            out += errors(sub, item, root, f"{path}[{i}]")
        if len(value) < schema.get("minItems", 0):
            out.append(f"{path}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            out.append(f"{path}: more than {schema['maxItems']} items")
    if kind == "string":
        if len(value) < schema.get("minLength", 0):
            out.append(f"{path}: shorter than {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            out.append(f"{path}: longer than {schema['maxLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f"{path}: {value!r} does not match {schema['pattern']!r}")
        if "format" in schema:
            if schema["format"] != "date":
                raise ValueError(f"json_schema_check does not implement format {schema['format']}")
            if not is_date(value):
                out.append(f"{path}: {value!r} is not a date")
    if kind == "number":
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{path}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{path}: {value} > maximum {schema['maximum']}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            out.append(f"{path}: {value} <= exclusiveMinimum {schema['exclusiveMinimum']}")
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            out.append(f"{path}: {value} >= exclusiveMaximum {schema['exclusiveMaximum']}")
    for sub in schema.get("allOf", []):
        out += errors(sub, value, root, path)
    if "anyOf" in schema and not any(not errors(s, value, root, path) for s in schema["anyOf"]):
        out.append(f"{path}: no anyOf branch matches")
    if "oneOf" in schema:
        matching = sum(1 for s in schema["oneOf"] if not errors(s, value, root, path))
        if matching != 1:
            out.append(f"{path}: {matching} oneOf branches match, not one")
    return out


def self_test():
    """The validator's own checks (run by the end-to-end test before it is trusted)."""
    schema = {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 9},
        "c": {"enum": ["a", "b"]},
        "t": {"type": "array", "items": {"type": "string", "maxLength": 2}, "minItems": 1,
              "maxItems": 2},
        "d": {"type": "string", "format": "date"},
        "o": {"$ref": "#/$defs/o"}},
        "required": ["n", "c"], "additionalProperties": False,
        "$defs": {"o": {"type": "object", "properties": {"x": {"type": "boolean"}},
                        "required": ["x"]}}}
    good = {"n": 3, "c": "a", "t": ["xy"], "d": "2024-02-29", "o": {"x": True}}
    assert errors(schema, good) == [], errors(schema, good)
    bad = [{"n": 3}, {"n": 0, "c": "a"}, {"n": 2.5, "c": "a"}, {"n": True, "c": "a"},
           {"n": 3, "c": "z"}, {"n": 3, "c": "a", "t": []}, {"n": 3, "c": "a", "t": ["xyz"]},
           {"n": 3, "c": "a", "t": ["a", "b", "c"]}, {"n": 3, "c": "a", "d": "2023-02-29"},
           {"n": 3, "c": "a", "o": {"x": 1}}, {"n": 3, "c": "a", "extra": 1}, []]
    for value in bad:
        assert errors(schema, value), f"accepted {value}"
    assert errors({"type": "integer"}, 4.0) == []
    assert errors({"const": 1}, True)
