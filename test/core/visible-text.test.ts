/**
 * The one rendering rule (core/visible-text.ts), held to Unicode's own data: the members of each property are
 * generated here from the engine's property escapes (and the overlay class and the right-to-left characters
 * from Python's unicodedata, a second source), never a few samples, and each must be shown as its code (or,
 * written right to left, reported as such) and refused in an identifier.
 */
import { execFileSync } from 'node:child_process';
import t from 'tap';
import { identifierProblem } from '../../core/identifier.js';
import {
  foundInWords,
  hasHiddenCharacters,
  hasRightToLeft,
  hiddenCode,
  hiddenInJson,
  revealHidden,
  RIGHT_TO_LEFT,
  textPieces,
  visibleJson,
} from '../../core/visible-text.js';

/** Every code point (but the surrogates) whose one-character string matches `re`. */
function members(re: RegExp): number[] {
  const out: number[] = [];
  for (let cp = 0; cp <= 0x10ffff; cp++) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    if (re.test(String.fromCodePoint(cp))) out.push(cp);
  }
  return out;
}

/** The code points for which a Python `unicodedata` expression of `c` (one character) holds. */
function fromPython(test: string): number[] {
  const out = execFileSync(
    'python3',
    ['-c', `import unicodedata\nprint(" ".join(str(n) for n in range(0x110000) if (lambda c: ${test})(chr(n))))`],
    { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 },
  );
  return out.trim().split(/\s+/).map(Number);
}

/** The code points whose canonical combining class is 1 (Overlay), from Python's unicodedata. */
const overlaysFromPython = (): number[] => fromPython('unicodedata.combining(c) == 1');

/** The code points each property (or class) names that the rule must catch anywhere in a text. */
const CLASSES: [string, RegExp][] = [
  ['Default_Ignorable_Code_Point', /^\p{Default_Ignorable_Code_Point}$/u],
  ['Bidi_Control', /^\p{Bidi_Control}$/u],
  ['General_Category=Format', /^\p{Cf}$/u],
  ['General_Category=Unassigned', /^\p{Cn}$/u],
  ['General_Category=Private_Use', /^\p{Co}$/u],
  ['line and paragraph separators', /^[\p{Zl}\p{Zp}]$/u],
  ['control characters but the newline', /^(?!\n)\p{Cc}$/u],
];

t.test('each member of each property is shown as its code and refused in an identifier', (t) => {
  for (const [name, re] of CLASSES) {
    const cps = members(re);
    t.ok(cps.length > 0, `${name}: the engine knows ${cps.length} members`);
    const missedShown = cps.filter((cp) => {
      const s = `a${String.fromCodePoint(cp)}b`;
      return !hasHiddenCharacters(s) || revealHidden(s) !== `a${hiddenCode(cp)}b`;
    });
    const missedRefused = cps.filter((cp) => identifierProblem(`a${String.fromCodePoint(cp)}b`) === null);
    t.same(missedShown.map(hiddenCode), [], `${name}: every member shown as its code`);
    t.same(missedRefused.map(hiddenCode), [], `${name}: every member refused in an identifier`);
  }
  t.end();
});

t.test('the combining overlays (class 1, from a second source) strike through nothing unseen', (t) => {
  const overlays = overlaysFromPython();
  t.ok(overlays.length >= 30, `Python's unicodedata lists ${overlays.length} overlays`);
  for (const cp of overlays) {
    const c = String.fromCodePoint(cp);
    t.equal(revealHidden(`a${c}`), `a${hiddenCode(cp)}`, `${hiddenCode(cp)} after a letter`);
    t.not(identifierProblem(`refund-4${c}2`), null, `${hiddenCode(cp)} refused in an identifier`);
  }
  t.end();
});

t.test('any combining mark on a digit is shown: 9\u0336 is not 9', (t) => {
  const marks = members(/^\p{M}$/u);
  const missed = marks.filter((cp) => revealHidden(`9${String.fromCodePoint(cp)}`) !== `9${hiddenCode(cp)}`);
  t.same(missed.map(hiddenCode), [], `all ${marks.length} combining marks after a digit`);
  // Two marks stacked on one digit: both shown.
  t.equal(revealHidden('1\u0301\u0336'), '1\\u0301\\u0336');
  t.equal(revealHidden('\u0663\u0336'), '\u0663\\u0336', 'on a digit of any script');
  t.end();
});

t.test('the characters the outside reviews found, each caught', (t) => {
  const found = [0x034f, 0x115f, 0x1160, 0x17b4, 0x180b, 0x2800, 0x3164, 0xffa0, 0x202e, 0x200b, 0xfeff];
  // Drawn as nothing though no property says so; private use, in the BMP and in both supplementary planes.
  const drawnAsNothing = [0x1d159, 0x16fe4, 0xe000, 0xf8ff, 0xf0000, 0x10fffd];
  for (const cp of [...found, ...drawnAsNothing]) {
    const s = `refund${String.fromCodePoint(cp)}42`;
    t.ok(hasHiddenCharacters(s), `${hiddenCode(cp)} found`);
    t.not(identifierProblem(s), null, `${hiddenCode(cp)} refused`);
  }
  t.equal(revealHidden('refund of \u202e0057\u202c EUR'), 'refund of \\u202E0057\\u202C EUR');
  t.equal(revealHidden('\u{E0041}'), '\\u{E0041}', 'beyond the BMP, braced');
  t.equal(revealHidden('pay invoice 1\u{1D159}000'), 'pay invoice 1\\u{1D159}000', 'the null notehead');
  t.equal(revealHidden('x\u{16FE4}y'), 'x\\u{16FE4}y', 'the Khitan filler (a mark, after a letter too)');
  t.match(identifierProblem('task\u2800'), /holds \\u2800 at 4/, 'the message names the code and where');
  t.end();
});

t.test('ordinary text of many scripts is left as it is', (t) => {
  const samples = [
    'Zürich',
    'naïve café',
    'e\u0301', // a mark on a letter (the decomposed é)
    'مرحبا بالعالم',
    'שלום',
    'こんにちは',
    '한국어',
    'नमस्ते',
    'ไทย',
    '👍 ok',
    'refund of 0057 EUR\nsecond line',
    '१२३ ٤٥٦',
  ];
  for (const s of samples) {
    t.notOk(hasHiddenCharacters(s), JSON.stringify(s));
    t.equal(revealHidden(s), s);
    t.same(textPieces(s), [{ text: s }]);
  }
  for (const id of ['Zürich', 'agent-runtime-1', 'タスク-42', '한국어', 'नमस्ते', 'refund 42'])
    t.equal(identifierProblem(id), null, id);
  // Identifiers are stricter: no control character at all, no space but U+0020, nothing written right to left.
  for (const id of ['a\nb', 'a\tb', 'a\u00a0b', 'a\u3000b', 'نموذج', 'acct 1234 \u05d0 5678'])
    t.not(identifierProblem(id), null, JSON.stringify(id));
  t.end();
});

t.test('visibleJson is the same value with every hidden character escaped', (t) => {
  const every = members(/^[\p{Default_Ignorable_Code_Point}\p{Cf}\p{Cn}\u2800]$/u);
  // One string holding all of them, in chunks, plus marks on digits and a key with one.
  const value = {
    chunks: Array.from({ length: Math.ceil(every.length / 500) }, (_, i) =>
      every
        .slice(i * 500, i * 500 + 500)
        .map((cp) => String.fromCodePoint(cp))
        .join('x'),
    ),
    amount: '9\u0336 EUR',
    ['ke\u200by']: [1, 2.5, true, null, 'plain'],
  };
  for (const indent of [undefined, 2]) {
    const json = visibleJson(value, indent);
    t.notOk(hasHiddenCharacters(json.replaceAll('\n', '')), 'nothing hidden is left raw');
    t.same(JSON.parse(json), value, 'a parser reads the same value');
  }
  t.equal(visibleJson({ a: 'x\u202ey' }), '{"a":"x\\u202ey"}');
  t.equal(visibleJson({ a: '\u{E0041}' }), '{"a":"\\udb40\\udc41"}', 'beyond the BMP as its surrogate pair');
  t.equal(visibleJson(undefined), 'null');
  t.end();
});

t.test('hiddenInJson says where each one is', (t) => {
  t.same(hiddenInJson({ note: 'refund \u202e0057', list: ['ok', 'a\u200b'], ['k~/\u2060']: 1 }), [
    { path: '/note', code: '\\u202E', in: 'value', class: 'hidden' },
    { path: '/list/1', code: '\\u200B', in: 'value', class: 'hidden' },
    { path: '/k~0~1\u2060', code: '\\u2060', in: 'key', class: 'hidden' },
  ]);
  // Right-to-left text: once per string, with its first such character, before the string's hidden ones.
  const rtl = hiddenInJson({ memo: 'IBAN \u05d0 1234 5678 \u05d1\u200b', ['\u0627']: 'x' });
  t.same(rtl, [
    { path: '/memo', code: '\\u05D0', in: 'value', class: 'right_to_left' },
    { path: '/memo', code: '\\u200B', in: 'value', class: 'hidden' },
    { path: '/\u0627', code: '\\u0627', in: 'key', class: 'right_to_left' },
  ]);
  t.equal(
    foundInWords(rtl, 2),
    'right-to-left text at /memo (\\u05D0 first), \\u200B at /memo',
    'in words, for messages',
  );
  t.same(hiddenInJson({ a: 'plain', b: [1, { c: 'text' }] }), []);
  t.equal(hiddenInJson({ s: '\u200b'.repeat(500) }).length, 50, 'at most the limit');
  t.end();
});

/** Python's right-to-left characters: bidi class R (Hebrew and others) or AL (Arabic letters). */
const rightToLeftFromPython = (): number[] => fromPython('unicodedata.bidirectional(c) in ("R", "AL")');

t.test('text written right to left: every R and AL character, reported but drawn as itself', (t) => {
  // The adversarial case: no control character at all, yet "IBAN \u05d0 1234 5678" is drawn "IBAN 5678 1234 \u05d0".
  t.ok(hasRightToLeft('IBAN \u05d0 1234 5678'));
  t.notOk(hasHiddenCharacters('IBAN \u05d0 1234 5678'), 'the letter is not hidden: it stays drawn as itself');
  t.same(hiddenInJson({ memo: 'IBAN \u05d0 1234 5678' }), [
    { path: '/memo', code: '\\u05D0', in: 'value', class: 'right_to_left' },
  ]);
  const python = rightToLeftFromPython();
  t.ok(python.length > 2000, `Python's unicodedata gives ${python.length} code points bidi class R or AL`);
  // Each one the engine knows too (assigned here as well), caught by the class.
  const assigned = python.filter((cp) => !/^\p{Cn}$/u.test(String.fromCodePoint(cp)));
  const missed = assigned.filter((cp) => !RIGHT_TO_LEFT.test(String.fromCodePoint(cp)));
  t.same(missed.map(hiddenCode), [], `all ${assigned.length} assigned here are in the class`);
  // Every member of the class, generated from the engine: reported once per string, drawn as itself unless it is
  // also hidden (U+200F, the Arabic number signs), and refused in an identifier.
  const cps = members(RIGHT_TO_LEFT);
  t.ok(cps.length >= assigned.length, `the class holds ${cps.length} code points`);
  const wrong = cps.filter((cp) => {
    const c = String.fromCodePoint(cp);
    const found = hiddenInJson({ v: `a ${c} 1 2` }).filter((h) => h.class === 'right_to_left');
    const drawn = hasHiddenCharacters(c) || revealHidden(`a ${c} 1 2`) === `a ${c} 1 2`;
    return found.length !== 1 || found[0]?.code !== hiddenCode(cp) || !drawn;
  });
  t.same(wrong.map(hiddenCode), [], 'each reported with its code, and drawn as itself');
  const accepted = cps.filter((cp) => identifierProblem(`acct-${String.fromCodePoint(cp)}-1`) === null);
  t.same(accepted.map(hiddenCode), [], 'each refused in an identifier');
  t.match(identifierProblem('acct \u05d0 1'), /holds \\u05D0 at 5: a right-to-left character/);
  // Left-to-right scripts, digits of other scripts and marks on Latin letters are not caught.
  for (const s of ['Zürich', 'Zu\u0308rich', 'naïve', 'こんにちは', '한국어', 'नमस्ते १२३', 'ไทย', '0057 · 12'])
    t.notOk(hasRightToLeft(s), JSON.stringify(s));
  t.end();
});
