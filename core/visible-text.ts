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
 * - characters drawn blank that no property names: U+2800 (Braille pattern blank);
 * - the combining overlays (canonical combining class 1: U+0334..U+0338 strike through what precedes them,
 *   U+20D2 and others), and any combining mark on a digit: `9\u0336` reads as a struck-out nine or as nine.
 */

/** Canonical combining class 1 (Overlay), which no regex property escape names; a test holds it to Unicode's data. */
const OVERLAYS =
  '\\u0334-\\u0338\\u1CD4\\u1CE2-\\u1CE8\\u20D2\\u20D3\\u20D8-\\u20DA\\u20E5\\u20E6\\u20EA\\u20EB' +
  '\\u{10A39}\\u{16AF0}-\\u{16AF4}\\u{1BC9E}\\u{1D167}-\\u{1D169}';

/** Drawn as a blank though no property says so. */
const BLANKS = '\\u2800';

/** Every hidden character but the control characters, which the two uses below treat differently. */
const CLASS = `\\p{Default_Ignorable_Code_Point}\\p{Bidi_Control}\\p{Cf}\\p{Zl}\\p{Zp}\\p{Cs}\\p{Cn}${BLANKS}${OVERLAYS}`;

/** A combining mark after a digit (and after any marks already on it). */
const MARK_ON_DIGIT = '(?<=\\p{Nd}\\p{M}*)\\p{M}';

/** Hidden in text a person reads; the newline is text's own line break and stays one. */
const HIDDEN_SOURCE = `${MARK_ON_DIGIT}|[${CLASS}\\u0000-\\u0009\\u000B-\\u001F\\u007F-\\u009F]`;

/** Refused in an identifier: every hidden character, every control character, every space but U+0020. */
const IDENTIFIER_FORBIDDEN_SOURCE = `${MARK_ON_DIGIT}|[${CLASS}\\p{Cc}\\u00A0\\u1680\\u2000-\\u200A\\u202F\\u205F\\u3000]`;

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

/** A hidden character in a JSON value: where (a JSON pointer; `key` when in an object's key) and its code. */
export interface HiddenFound {
  path: string;
  code: string;
  in: 'key' | 'value';
}

const pointer = (path: string, key: string): string => `${path}/${key.replaceAll('~', '~0').replaceAll('/', '~1')}`;

/** Every hidden character in a JSON value's strings and keys, in document order (at most `limit`). */
export function hiddenInJson(value: unknown, limit = 50): HiddenFound[] {
  const found: HiddenFound[] = [];
  const scan = (text: string, path: string, where: HiddenFound['in']): void => {
    if (!hasHiddenCharacters(text)) return;
    for (const p of textPieces(text))
      if ('hidden' in p && found.length < limit) found.push({ path, code: p.hidden, in: where });
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
