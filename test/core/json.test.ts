import t from 'tap';
import { canonicalArguments, canonicalJson, parseStrictJson, sha256Hex, type JsonValue } from '../../core/json.js';

const bounds = { maxBytes: 1 << 20, maxDepth: 32 };

t.test('RFC 8785 test vectors', (t) => {
  // RFC 8785 section 3.2.2: the sample object and its canonical form.
  const sample = parseStrictJson(
    '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001], "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/", "literals": [null, true, false]}',
  );
  t.equal(
    canonicalJson(sample),
    '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}',
  );
  // RFC 8785 section 3.2.3: property sorting by UTF-16 code units.
  const sorting = parseStrictJson(
    '{"\\u20ac": "Euro Sign", "\\r": "Carriage Return", "\\ufb33": "Hebrew Letter Dalet With Dagesh", "1": "One", "\\ud83d\\ude00": "Emoji: Grinning Face", "\\u0080": "Control", "\\u00f6": "Latin Small Letter O With Diaeresis"}',
  );
  const text = canonicalJson(sorting);
  const order = ['Carriage Return', 'One', 'Control', 'Latin Small', 'Euro Sign', 'Emoji', 'Hebrew'].map((v) =>
    text.indexOf(v),
  );
  t.same(
    [...order].sort((x, y) => x - y),
    order,
    'keys in UTF-16 code unit order',
  );
  t.ok(order.every((i) => i > 0));
  // Appendix B: IEEE 754 number serialisation.
  const numbers: [number, string][] = [
    [0, '0'],
    [-0, '0'],
    [5e-324, '5e-324'],
    [1.7976931348623157e308, '1.7976931348623157e+308'],
    [9007199254740992, '9007199254740992'],
    [1e21, '1e+21'],
    [1e20, '100000000000000000000'],
    [0.000001, '0.000001'],
    [1e-7, '1e-7'],
    [295147905179352830000, '295147905179352830000'],
  ];
  for (const [n, text] of numbers) t.equal(canonicalJson(n), text, `number ${text}`);
  t.end();
});

t.test('key order and number spelling do not change the hash', (t) => {
  const a = canonicalArguments(parseStrictJson('{"b":1.0,"a":[1e2,"x"],"c":{"z":0.50,"y":-0}}'), bounds);
  const b = canonicalArguments({ c: { y: 0, z: 0.5 }, a: [100, 'x'], b: 1 }, bounds);
  t.equal(a, b);
  t.equal(sha256Hex(a), sha256Hex(b));
  t.not(
    sha256Hex(canonicalArguments({ amount: 10 }, bounds)),
    sha256Hex(canonicalArguments({ amount: 10000 }, bounds)),
  );
  t.end();
});

t.test('strict parsing refuses what JSON.parse accepts', (t) => {
  const hostile: [string, string][] = [
    ['duplicate key', '{"a":1,"a":2}'],
    ['nested duplicate key', '{"x":{"amount":10,"amount":10000}}'],
    ['__proto__', '{"__proto__":{"admin":true}}'],
    ['2^53+1', '{"n":9007199254740993}'],
    ['lone surrogate', '{"s":"\\ud800"}'],
    ['lone surrogate key', '{"\\udc00":1}'],
    ['trailing comma', '{"a":1,}'],
    ['comment', '{"a":1 /* x */}'],
    ['NaN', '{"a":NaN}'],
    ['huge exponent', '{"a":1e400}'],
    ['two values', '{"a":1} {"b":2}'],
    ['single quotes', "{'a':1}"],
  ];
  for (const [name, text] of hostile) t.throws(() => parseStrictJson(text), { code: 'invalid_json' }, name);
  t.throws(
    () => parseStrictJson('[1]', { requireObject: true }),
    { code: 'invalid_json' },
    'array root when an object is required',
  );
  t.throws(
    () => parseStrictJson('{"a":1}', { bounds: { maxBytes: 4, maxDepth: 8 } }),
    { code: 'invalid_json' },
    'over the byte bound',
  );
  t.throws(
    () => parseStrictJson('{"a":{"b":{"c":1}}}', { bounds: { maxBytes: 100, maxDepth: 2 } }),
    { code: 'invalid_json' },
    'over the depth bound',
  );
  t.throws(() => parseStrictJson(Buffer.from([0x7b, 0xff, 0x7d])), { code: 'invalid_json' }, 'invalid UTF-8');
  const ok = parseStrictJson('{"a":[1,2.5,"x",null,true],"b":{"c":-1e-3}}') as Record<string, JsonValue>;
  t.same(ok, { a: [1, 2.5, 'x', null, true], b: { c: -0.001 } });
  t.equal(Object.getPrototypeOf(ok), Object.prototype, 'parsed objects are plain');
  t.end();
});
