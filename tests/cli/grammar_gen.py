# tests/cli/grammar_gen.py: the structured-output cases of tests/cli/grammar.sh.
#   grammar_gen.py gen N SEED OUT.jsonl   N random JSON Schemas (nested objects,
#       optional properties, enums, const, arrays with bounds, $defs/$ref,
#       recursion, anyOf, type lists, integer bounds, string lengths and
#       patterns, maps), each with the request fields of one JSONL line
#   grammar_gen.py fixed OUT.jsonl   regular expressions, choices, a grammar, json_object
#   grammar_gen.py check CASES.jsonl OUT.jsonl   every output checked against
#       its case: a schema with jsonschema (Debian's python3-jsonschema), a
#       regex with re.fullmatch, a choice by membership; an output cut by
#       max_tokens ("length") is counted, never taken as valid
# The schemas keep outputs short (maxLength, maxItems, depth), so that a
# random-weight model, which the constraint alone steers, mostly finishes.
import json, random, re, sys

def string_schema(r):
    k = r.randrange(5)
    if k == 0:
        return {"type": "string", "maxLength": r.randint(0, 6)}
    if k == 1:
        lo = r.randint(0, 3)
        return {"type": "string", "minLength": lo, "maxLength": lo + r.randint(0, 5)}
    if k == 2:
        return {"type": "string", "pattern": r.choice(["^[a-z]{1,5}$", "^[A-Z][a-z]{0,4}$", "^\\d{3}-\\d{2}$",
                                                       "^(yes|no|maybe)$", "^[0-9a-f]{4}$", "^a+b?$"])}
    if k == 3:
        return {"type": "string", "enum": r.sample(["red", "green", "blue", "x y", "q\"uote", "é"], r.randint(1, 4))}
    return {"type": "string", "const": r.choice(["fixed", "", "tab\there"])}

def int_schema(r):
    k = r.randrange(5)
    if k == 0:
        return {"type": "integer"}
    if k == 1:
        lo = r.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + r.randint(0, 300)}
    if k == 2:
        return {"type": "integer", "minimum": r.randint(0, 1000)}
    if k == 3:
        return {"type": "integer", "exclusiveMaximum": r.randint(-20, 20), "exclusiveMinimum": -100}
    return {"type": "integer", "enum": r.sample([0, 1, 7, 42, -3, 1000], r.randint(1, 3))}

def leaf(r):
    k = r.randrange(8)
    if k < 2:
        return string_schema(r)
    if k < 4:
        return int_schema(r)
    if k == 4:
        return {"type": "number"}
    if k == 5:
        return {"type": "boolean"}
    if k == 6:
        return {"type": r.sample(["string", "integer", "null", "boolean"], 2), "maxLength": 4}
    return {"enum": r.sample(["a", 1, None, True, 2.5, "b"], r.randint(1, 4))}

def schema(r, depth, defs):
    k = r.randrange(10) if depth > 0 else 0
    if k <= 3:
        return leaf(r)
    if k <= 6:
        n = r.randint(1, 4)
        props = {}
        for i in range(n):
            props[r.choice(["name", "id", "tags", "a", "b_c", "value", "é", "sp ace", "n%d" % i]) + str(i)] = schema(r, depth - 1, defs)
        s = {"type": "object", "properties": props}
        req = [p for p in props if r.random() < 0.6]
        if req:
            s["required"] = req
        if r.random() < 0.5:
            s["additionalProperties"] = False
        if r.random() < 0.2:
            s["description"] = "an object"
        return s
    if k == 7:
        lo = r.randint(0, 2)
        return {"type": "array", "items": schema(r, depth - 1, defs), "minItems": lo, "maxItems": lo + r.randint(0, 2)}
    if k == 8:
        name = "d%d" % len(defs)
        defs[name] = None             # the name taken before its schema is made
        defs[name] = schema(r, depth - 1, defs)
        return {"$ref": "#/$defs/" + name}
    return {"anyOf": [schema(r, depth - 1, defs) for _ in range(r.randint(2, 3))]}

def gen(n, seed, out):
    r = random.Random(seed)
    with open(out, "w") as f:
        for i in range(n):
            defs = {}
            if i % 25 == 24:          # recursion through $ref: a small tree
                s = {"$defs": {"node": {"type": "object", "properties": {
                        "v": {"type": "integer", "minimum": 0, "maximum": 9},
                        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
                        "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"}
            elif i % 25 == 23:        # a map
                s = {"type": "object", "additionalProperties": leaf(r)}
            else:
                s = schema(r, 3, defs)
                if i % 2 == 0 and s.get("type") != "object":
                    s = {"type": "object", "properties": {"x": s}, "required": ["x"]}
                if defs:
                    s = dict(s)
                    s["$defs"] = defs
            line = {"prompt": r.choice(["Once upon a time", "The cat", "Lily and Ben", "{"]), "max_tokens": 96}
            if i % 3 == 0:
                line["response_format"] = {"type": "json_schema", "json_schema": {"name": "s%d" % i, "schema": s}}
            else:
                line["guided_json"] = s
            f.write(json.dumps({"case": {"schema": s}, "line": line}) + "\n")

REGEXES = [r"[A-Z][a-z]{2,6} (ran|sat)\.", r"\d{3}-\d{4}", r"(ab|cd)+e?", r"[^a-z ]{2,5}", r"\w+@\w+\.com",
           r"(?:yes|no)", r"x*y+z?", r"[0-9a-fA-F]{6}", r"\s?[a-c]{1,3}", r"(?P<w>[a-z]+) (?P=w)?".replace(" (?P=w)?", "!"),
           r"\D\W\S", r"a.b", r"(\(\d\)|-){1,3}", r"[\]\[-]+", r"[αβγ]{2}é", r"^[a-z]{3}$", r"(a|b){2,}?c",
           r"\[\{\}\]", r"[^\n]{1,4}\n?", r"1{,3}2"]
CHOICES = [["yes", "no"], ["a happy day", "the end", "Lily"], ["{", "}", "\"quoted\""], ["x"], ["é", "ü", "ß"],
           ["Once", "Once upon", "Once upon a time"]]

def fixed(out):
    with open(out, "w") as f:
        for i, rx in enumerate(REGEXES):
            line = {"prompt": "Once upon a time", "max_tokens": 40, "guided_regex": rx}
            f.write(json.dumps({"case": {"regex": rx}, "line": line}) + "\n")
        for i, ch in enumerate(CHOICES):
            line = {"prompt": "The cat", "max_tokens": 40, "guided_choice": ch}
            f.write(json.dumps({"case": {"choice": ch}, "line": line}) + "\n")
        # a grammar, checked by the regular expression it is equivalent to
        g = 'root ::= item ("," item){0,2}\nitem ::= [a-z]{1,4} | "(" [0-9]+ ")"'
        line = {"prompt": "Lily", "max_tokens": 40, "guided_grammar": g}
        f.write(json.dumps({"case": {"regex": r"([a-z]{1,4}|\(\d+\))(,([a-z]{1,4}|\(\d+\))){0,2}"}, "line": line}) + "\n")
        line = {"prompt": "Lily", "max_tokens": 60, "response_format": {"type": "json_object"}}
        f.write(json.dumps({"case": {"schema": {"type": "object"}}, "line": line}) + "\n")

def check(cases, outs):
    cs = [json.loads(l)["case"] for l in open(cases)]
    os_ = [json.loads(l) for l in open(outs)]
    assert len(cs) == len(os_), (len(cs), len(os_))
    import jsonschema
    done = cut = 0
    for i, (c, o) in enumerate(zip(cs, os_)):
        t = o["text"]
        if o["finish_reason"] == "length":
            cut += 1
            continue
        assert o["finish_reason"] in ("stop", "eos"), (i, o["finish_reason"], o.get("error"))
        if "schema" in c:
            jsonschema.validate(json.loads(t), c["schema"])
        elif "regex" in c:
            assert re.fullmatch(c["regex"], t), (i, c["regex"], t)
        elif "choice" in c:
            assert t in c["choice"], (i, c["choice"], t)
        done += 1
    print("%d %d" % (done, cut))

if __name__ == "__main__":
    if sys.argv[1] == "gen":
        gen(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    elif sys.argv[1] == "fixed":
        fixed(sys.argv[2])
    else:
        check(sys.argv[2], sys.argv[3])
