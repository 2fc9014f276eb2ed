/**
 * The one rule for text a person decides on: what they read is what is stored. A character that a screen draws
 * as nothing, draws as a blank, reorders the text around it or strikes through a digit is never drawn as
 * itself: every surface that shows a request to a person (the console, Slack, webhook summaries, the CLI) shows
 * it as its code (`\u202E`), and an approval holding one needs an explicit acknowledgement (gate/approvals.ts).
 * Identifiers refuse the same set (core/identifier.ts).
 *
 * The set comes from Unicode's properties, so it follows the engine's Unicode version rather than a hand list:
 * - `Default_Ignorable_Code_Point`: zero-width spaces and joiners, the combining grapheme joiner U+034F, the
 *   Hangul fillers (U+115F, U+1160, U+3164, U+FFA0), Khmer's U+17B4, the Mongolian and other variation
 *   selectors, tag characters, the soft hyphen, the byte-order mark;
 * - `Bidi_Control` (embeddings, overrides, isolates, marks) and every other format character (`Cf`);
 * - control characters (`Cc`) but the newline, line and paragraph separators, unpaired surrogates and
 *   unassigned code points (which no font draws as what a later Unicode will make them);
 * - private-use code points (`Co`, in every plane): what they look like is whatever a font chose, often nothing;
 * - characters drawn blank that no property names ({@link BLANKS});
 * - the combining overlays (canonical combining class 1: U+0334..U+0338 strike through what precedes them,
 *   U+20D2 and others), and any combining mark on a digit: `9\u0336` reads as a struck-out nine or as nine.
 *
 * Text written right to left is the other half of the rule. A visible right-to-left letter needs no control
 * character to reorder what is around it: `IBAN \u05D0 1234 5678` is drawn `IBAN 5678 1234 \u05D0`. Such
 * letters are not hidden and stay drawn as themselves, but a string that holds one ({@link RIGHT_TO_LEFT}) is
 * reported beside the hidden characters (class `right_to_left`) and needs the same acknowledgement; the console
 * draws it in the order it is stored. Identifiers refuse right-to-left letters outright.
 */

/** Canonical combining class 1 (Overlay), which no regex property escape names; a test holds it to Unicode's data. */
const OVERLAYS =
  '\\u0334-\\u0338\\u1CD4\\u1CE2-\\u1CE8\\u20D2\\u20D3\\u20D8-\\u20DA\\u20E5\\u20E6\\u20EA\\u20EB' +
  '\\u{10A39}\\u{16AF0}-\\u{16AF4}\\u{1BC9E}\\u{1D167}-\\u{1D169}';

/**
 * Drawn as nothing or as a blank though no property says so; kept short, each one named with why:
 * - U+2800 BRAILLE PATTERN BLANK: the braille cell with no dots, drawn as a space by every font;
 * - U+16FE4 KHITAN SMALL SCRIPT FILLER: a nonspacing mark with no glyph (it only pads a Khitan cluster);
 * - U+1D159 MUSICAL SYMBOL NULL NOTEHEAD: a placeholder notehead with no ink, drawn as nothing.
 */
const BLANKS = '\\u2800\\u{16FE4}\\u{1D159}';

/** Every hidden character but the control characters, which the two uses below treat differently. */
const CLASS = `\\p{Default_Ignorable_Code_Point}\\p{Bidi_Control}\\p{Cf}\\p{Zl}\\p{Zp}\\p{Cs}\\p{Cn}\\p{Co}${BLANKS}${OVERLAYS}`;

/**
 * The scripts written right to left (Unicode's `Script` property; a test holds the class to every character
 * Python's unicodedata gives bidi class R or AL). A script this engine's Unicode does not know yet is left out
 * rather than failing to load (Garay arrived in Unicode 16).
 */
const RTL_SCRIPTS = (
  'Adlam Arabic Avestan Chorasmian Cypriot Elymaic Garay Hanifi_Rohingya Hatran Hebrew Imperial_Aramaic ' +
  'Inscriptional_Pahlavi Inscriptional_Parthian Kharoshthi Lydian Mandaic Manichaean Mende_Kikakui ' +
  'Meroitic_Cursive Meroitic_Hieroglyphs Nabataean Nko Old_Hungarian Old_North_Arabian Old_Sogdian ' +
  'Old_South_Arabian Old_Turkic Old_Uyghur Palmyrene Phoenician Psalter_Pahlavi Samaritan Sogdian Syriac ' +
  'Thaana Yezidi'
).split(' ');

/**
 * Right-to-left characters of no right-to-left script (Script=Common): the Arabic semicolon U+061B, question
 * mark U+061F and tatweel U+0640, the right-to-left mark U+200F (also a bidi control, so shown as its code),
 * and the Indic and Ottoman Siyaq numbers (U+1EC70..U+1ECBF, U+1ED00..U+1ED4F).
 */
const RTL_COMMON = '\\u061B\\u061F\\u0640\\u200F\\u{1EC70}-\\u{1ECBF}\\u{1ED00}-\\u{1ED4F}';

const scriptEscape = (name: string): string => {
  const escape = `\\p{Script=${name}}`;
  try {
    new RegExp(escape, 'u');
    return escape;
  } catch {
    return '';
  }
};

/** The class of right-to-left characters (see the module comment). */
const RTL_CLASS = RTL_SCRIPTS.map(scriptEscape).join('') + RTL_COMMON;

/** A character written right to left: one in a string makes the digits and words around it reorder on screen. */
export const RIGHT_TO_LEFT: RegExp = new RegExp(`[${RTL_CLASS}]`, 'u');

/** A combining mark after a digit (and after any marks already on it). */
const MARK_ON_DIGIT = '(?<=\\p{Nd}\\p{M}*)\\p{M}';

/** Hidden in text a person reads; the newline is text's own line break and stays one. */
const HIDDEN_SOURCE = `${MARK_ON_DIGIT}|[${CLASS}\\u0000-\\u0009\\u000B-\\u001F\\u007F-\\u009F]`;

/**
 * Refused in an identifier: every hidden character, every control character, every space but U+0020, and every
 * right-to-left character (an identifier is shown to people inside other text, where it would reorder).
 */
const IDENTIFIER_FORBIDDEN_SOURCE = `${MARK_ON_DIGIT}|[${CLASS}${RTL_CLASS}\\p{Cc}\\u00A0\\u1680\\u2000-\\u200A\\u202F\\u205F\\u3000]`;

const HIDDEN_ONE = new RegExp(HIDDEN_SOURCE, 'u');
const HIDDEN_ALL = new RegExp(HIDDEN_SOURCE, 'gu');

/** Whether an identifier holds a character it may not (see the module comment). */
export const IDENTIFIER_FORBIDDEN: RegExp = new RegExp(IDENTIFIER_FORBIDDEN_SOURCE, 'u');

/** A code point as it is shown in place of the character: `\u202E`, or `\u{E0041}` beyond the BMP. */
export function hiddenCode(codePoint: number): string {
  const hex = codePoint.toString(16).toUpperCase();
  return codePoint > 0xffff ? `\\u{${hex}}` : `\\u${hex.padStart(4, '0')}`;
}

/** Whether the text holds a character a person would not read as written. */
export function hasHiddenCharacters(text: string): boolean {
  return HIDDEN_ONE.test(text);
}

/** Whether the text holds a right-to-left character, which reorders the digits and words around it on screen. */
export function hasRightToLeft(text: string): boolean {
  return RIGHT_TO_LEFT.test(text);
}

/** One stretch of text: either drawn as it is or a hidden character shown by its code. */
export type TextPiece = { text: string } | { hidden: string };

/** The text cut into what is drawn as it is and each hidden character's code, in order. */
export function textPieces(text: string): TextPiece[] {
  const out: TextPiece[] = [];
  let last = 0;
  for (const m of text.matchAll(HIDDEN_ALL)) {
    if (m.index > last) out.push({ text: text.slice(last, m.index) });
    out.push({ hidden: hiddenCode(m[0].codePointAt(0) ?? 0) });
    last = m.index + m[0].length;
  }
  if (last < text.length || out.length === 0) out.push({ text: text.slice(last) });
  return out;
}

/**
 * The text with each hidden character replaced by `mark(code)` (by default the code itself), and every other
 * character left to `plain` (by default as it is): a surface's escaping goes in `plain`, its highlight in `mark`.
 */
export function revealHidden(
  text: string,
  mark: (code: string) => string = (code) => code,
  plain: (text: string) => string = (t) => t,
): string {
  if (!hasHiddenCharacters(text)) return plain(text);
  return textPieces(text)
    .map((p) => ('hidden' in p ? mark(p.hidden) : plain(p.text)))
    .join('');
}

/**
 * Text for one line (a table cell): as {@link revealHidden}, with the newline shown as its code too (`\u000A`),
 * as every other control character is, so a value cannot start a line of its own and pass for another row.
 */
export function revealInLine(text: string): string {
  return revealHidden(text).replaceAll('\n', hiddenCode(0x0a));
}

/**
 * What a reader would not see as stored, in a JSON value: where (a JSON pointer; `key` when in an object's key),
 * and either a hidden character (class `hidden`, its code) or a string that holds right-to-left characters
 * (class `right_to_left`, once per string, with the code of the first one).
 */
export interface HiddenFound {
  path: string;
  code: string;
  in: 'key' | 'value';
  class: 'hidden' | 'right_to_left';
}

const pointer = (path: string, key: string): string => `${path}/${key.replaceAll('~', '~0').replaceAll('/', '~1')}`;

/**
 * Every hidden character in a JSON value's strings and keys, and every string holding right-to-left characters
 * (before that string's hidden characters), in document order (at most `limit`).
 */
export function hiddenInJson(value: unknown, limit = 50): HiddenFound[] {
  const found: HiddenFound[] = [];
  const scan = (text: string, path: string, where: HiddenFound['in']): void => {
    const rtl = RIGHT_TO_LEFT.exec(text);
    if (rtl !== null && found.length < limit)
      found.push({ path, code: hiddenCode(rtl[0].codePointAt(0) ?? 0), in: where, class: 'right_to_left' });
    if (!hasHiddenCharacters(text)) return;
    for (const p of textPieces(text))
      if ('hidden' in p && found.length < limit) found.push({ path, code: p.hidden, in: where, class: 'hidden' });
  };
  const walk = (v: unknown, path: string): void => {
    if (found.length >= limit) return;
    if (typeof v === 'string') scan(v, path, 'value');
    else if (Array.isArray(v)) v.forEach((item, i) => walk(item, `${path}/${i}`));
    else if (v !== null && typeof v === 'object')
      for (const [k, item] of Object.entries(v)) {
        scan(k, pointer(path, k), 'key');
        walk(item, pointer(path, k));
      }
  };
  walk(value, '');
  return found;
}

/**
 * The first `max` of `found` in words, for a message: `\u202E at /arguments/note` for a hidden character,
 * `right-to-left text at /arguments/memo (\u05D0 first)` for a string that holds right-to-left characters.
 */
export function foundInWords(found: readonly HiddenFound[], max: number): string {
  return found
    .slice(0, max)
    .map((h) =>
      h.class === 'right_to_left'
        ? `right-to-left text at ${h.path === '' ? '/' : h.path} (${h.code} first)`
        : `${h.code} at ${h.path === '' ? '/' : h.path}`,
    )
    .join(', ');
}

/**
 * JSON text in which every hidden character inside a string is written as its `\uXXXX` escape (a surrogate
 * pair beyond the BMP): the same value to any parser, and nothing a terminal or a chat client would hide or
 * reorder. Otherwise as `JSON.stringify(value, null, indent)`.
 */
export function visibleJson(value: unknown, indent?: number): string {
  const json = JSON.stringify(value, null, indent) as string | undefined;
  if (json === undefined) return 'null';
  if (!hasHiddenCharacters(json)) return json;
  // Every hidden character JSON.stringify leaves raw sits inside a string: structure is ASCII, and the newlines
  // of the indentation are not hidden. A mark on a digit is after a digit of the string, never of a number.
  return json.replace(HIDDEN_ALL, (c) =>
    [...c]
      .flatMap((ch) => {
        const cp = ch.codePointAt(0) ?? 0;
        return cp > 0xffff ? [0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + ((cp - 0x10000) & 0x3ff)] : [cp];
      })
      .map((u) => `\\u${u.toString(16).padStart(4, '0')}`)
      .join(''),
  );
}
