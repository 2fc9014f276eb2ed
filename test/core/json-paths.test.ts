/**
 * parseStrictJson's two paths give one answer: for every text, the value it returns (or the error it throws) is
 * the momoa path's (`parseStrictJsonByAst`), whether its `JSON.parse` path took the text or handed it on.
 */
import t, { type Test } from 'tap';
import { parseStrictJson, parseStrictJsonByAst, type JsonBounds } from '../../core/json.js';

type Outcome = { value: unknown } | { error: { code: string; message: string; details: unknown } };

function outcome(parse: () => unknown): Outcome {
  try {
    return { value: parse() };
  } catch (err) {
    const e = err as { code: string; message: string; details?: unknown };
    return { error: { code: e.code, message: e.message, details: e.details } };
  }
}

/** Equal as parsed JSON: same types, -0 kept apart from 0, same key order, every object plain. */
function sameJson(a: unknown, b: unknown): boolean {
  if (typeof a !== typeof b) return false;
  if (typeof a === 'number') return Object.is(a, b);
  if (a === null || b === null || typeof a !== 'object') return a === b;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (
    !Array.isArray(a) &&
    (Object.getPrototypeOf(a) !== Object.prototype || Object.getPrototypeOf(b) !== Object.prototype)
  )
    return false;
  const ka = Object.keys(a);
  const kb = Object.keys(b as object);
  if (ka.length !== kb.length || ka.some((k, i) => k !== kb[i])) return false;
  return ka.every((k) => sameJson((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
}

/** Whether both paths took the text (true) or refused it (false); asserts they agree. */
function agree(
  t: Test,
  text: string | Uint8Array,
  options: { bounds?: JsonBounds; requireObject?: boolean } = {},
): boolean {
  const fast = outcome(() => parseStrictJson(text, options));
  const slow = outcome(() => parseStrictJsonByAst(text, options));
  // ASCII only: a U+2028 in an assertion's name would end its TAP line.
  const label =
    typeof text === 'string'
      ? JSON.stringify(text)
          .slice(0, 120)
          .replace(/[^\x20-\x7e]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)
      : `bytes ${Buffer.from(text).toString('hex').slice(0, 120)}`;
  if ('value' in fast && 'value' in slow) t.ok(sameJson(fast.value, slow.value), `same value: ${label}`);
  else t.same(fast, slow, `same outcome: ${label}`);
  return 'value' in slow;
}

const VALID = [
  '{}',
  '[]',
  '{"tool":"issue_refund","arguments":{"order_id":"ord-1","amount":1250,"currency":"EUR"},"task_id":"t","workflow_step_id":"s1"}',
  ' \t\r\n{ "a" : [ 1 , 2.5 , "x" , null , true , false ] , "b" : { "c" : -1e-3 } } \n',
  '{"z":1,"a":2,"10":3,"2":4}',
  '{"n":-0}',
  '{"n":[0,-0,0.0,-0.0,1e0,1E+2,1e-7,5e-324,1.7976931348623157e308,123456789012345]}',
  '{"n":9007199254740991}',
  '{"n":-9007199254740991}',
  '{"n":1234567890.1234567890123}',
  '{"n":0.00000000000000000000000000001}',
  '{"s":"\\u20ac\\n\\t\\"\\\\\\/\\b\\f\\r","e":"\\ud83d\\ude00","r":"\u2028\u2029\u00e9"}',
  '{"":"empty key","a b":"space","\\u0041":"escaped key"}',
  '{"a":{"a":{"a":{}}},"b":[[[]]]}',
  '"a string root"',
  '12',
  'null',
  'true',
  '[{"a":1},{"a":1}]',
  '{"colon":"a:b:c","brace":"{[","quote":"\\"{"}',
  '{"digits":"12345678901234567890"}',
  '{"constructor":1,"toString":2,"hasOwnProperty":3}',
];

const INVALID = [
  '',
  ' ',
  '{',
  '{"a":1,}',
  '{"a":1,"a":2}',
  '{"x":{"amount":10,"amount":10000}}',
  '[{"a":1,"b":2,"a":3}]',
  '{"__proto__":{"admin":true}}',
  '{"a":{"__proto__":1}}',
  '{"n":9007199254740993}',
  '{"n":-9007199254740993}',
  '{"n":12345678901234567890}',
  '{"n":1e400}',
  '{"n":-1e400}',
  '{"s":"\\ud800"}',
  '{"\\udc00":1}',
  '{"s":"\\u0000"}',
  '{"\\u0000":1}',
  '{"s":"raw\u0001control"}',
  '{"a":1 /* x */}',
  '{"a":NaN}',
  '{"a":1} {"b":2}',
  "{'a':1}",
  '\ufeff{"a":1}',
  '{"a":01}',
  '{"a":.5}',
  '{"a":+1}',
  '{"a":1.}',
  '{"a":\u00a01}',
  '{"a"\u000b:1}',
  '[1,]',
  '{"a":undefined}',
  '{"a":"\\x41"}',
  '{"a":"unterminated}',
];

t.test('valid texts: the same value by both paths', (t) => {
  for (const text of VALID) {
    agree(t, text);
    agree(t, Buffer.from(text, 'utf8'));
  }
  t.end();
});

t.test('refused texts: the same error by both paths', (t) => {
  for (const text of INVALID) {
    agree(t, text);
    agree(t, Buffer.from(text, 'utf8'));
  }
  agree(t, Buffer.from([0x7b, 0xff, 0x7d]));
  agree(t, Buffer.from([0xef, 0xbb, 0xbf, 0x7b, 0x7d]), {});
  t.end();
});

t.test('options: the object root, the byte and depth bounds', (t) => {
  for (const text of ['[1]', '"x"', '1', 'null', '{"a":1}'])
    for (const requireObject of [true, false]) agree(t, text, { requireObject });
  const tight = { maxBytes: 16, maxDepth: 2 };
  for (const text of ['{"a":{"b":1}}', '{"a":{"b":{"c":1}}}', '[[1]]', '[[[1]]]', '{"a":"0123456789"}'])
    agree(t, text, { bounds: tight });
  agree(t, `${'['.repeat(100_000)}${']'.repeat(100_000)}`, { bounds: { maxBytes: 1 << 20, maxDepth: 64 } });
  t.end();
});

/** A small deterministic generator (mulberry32), so a failure names a seed that reproduces it. */
function random(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = Math.imul(a ^ (a >>> 15), 1 | a);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

const PIECES = ['"a"', '"b"', '"__proto__"', '"\\ud800"', '"\\u0000"', '"é"', '1', '-0', '1e400', '9007199254740993'];
const PUNCT = ['{', '}', '[', ']', ',', ':', ' ', '"', '\\', '0', 'e', '-', '.'];

function generate(next: () => number, depth: number): string {
  const r = next();
  if (depth > 3 || r < 0.3) return PIECES[Math.floor(next() * PIECES.length)] ?? '1';
  const n = Math.floor(next() * 4);
  if (r < 0.6) return `[${Array.from({ length: n }, () => generate(next, depth + 1)).join(',')}]`;
  const keys = ['"a"', '"b"', '"c"', '"__proto__"', '"\\u0061"'];
  const members = Array.from(
    { length: n },
    () => `${keys[Math.floor(next() * keys.length)] ?? '"a"'}:${generate(next, depth + 1)}`,
  );
  return `{${members.join(',')}}`;
}

t.test('generated texts, some mutated: the same outcome by both paths', (t) => {
  const next = random(40);
  let taken = 0;
  for (let i = 0; i < 3000; i++) {
    let text = generate(next, 0);
    if (next() < 0.3) {
      const at = Math.floor(next() * (text.length + 1));
      const cut = next() < 0.5 ? 1 : 0;
      text = text.slice(0, at) + (PUNCT[Math.floor(next() * PUNCT.length)] ?? '') + text.slice(at + cut);
    }
    if (agree(t, text, { bounds: { maxBytes: 1 << 16, maxDepth: 4 } })) taken++;
  }
  // Both kinds are exercised: texts taken (by the fast path, unless they hold what it hands on) and refused.
  t.ok(taken > 300 && taken < 2700, `${taken} of 3000 generated texts taken`);
  t.end();
});
