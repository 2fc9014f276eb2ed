/**
 * The console's one escaping function and the tagged template built on it. Every `${value}` in an `html`
 * template is escaped (`&`, `<`, `>`, `"`, `'` and the backtick become entities) unless it is itself the
 * result of an `html` template; arrays are joined, null and undefined are empty. Nothing that came from
 * arguments, names or reasons can therefore become markup, whether it lands in text or in a quoted attribute.
 * Attribute values are always written in double quotes by the templates; URLs are built with `href()`, which
 * percent-encodes each part, so no value can start a `javascript:` URL.
 */

/** Markup that is already safe: only `html` and `href` make one. */
export class SafeHtml {
  readonly #text: string;
  constructor(text: string, token: symbol) {
    if (token !== MINT) throw new Error('SafeHtml is made by html`` only');
    this.#text = text;
  }
  toString(): string {
    return this.#text;
  }
}

const MINT = Symbol('safe-html');

const ENTITIES: Record<string, string> = {
  '&': '&amp;',
  '<': '&lt;',
  '>': '&gt;',
  '"': '&quot;',
  "'": '&#39;',
  '`': '&#96;',
};

/** Text as HTML text or a double-quoted attribute value. */
export function escapeHtml(value: string): string {
  return value.replace(/[&<>"'`]/g, (c) => ENTITIES[c] ?? c);
}

type Interpolated = SafeHtml | string | number | boolean | null | undefined | Date | readonly Interpolated[];

function piece(v: Interpolated): string {
  if (v === null || v === undefined || v === false) return '';
  if (v instanceof SafeHtml) return v.toString();
  if (Array.isArray(v)) return (v as readonly Interpolated[]).map(piece).join('');
  if (v instanceof Date) return escapeHtml(v.toISOString());
  return escapeHtml(String(v));
}

/** The tagged template: literal parts as written, every interpolation escaped. */
export function html(strings: TemplateStringsArray, ...values: Interpolated[]): SafeHtml {
  let out = strings[0] ?? '';
  for (let i = 0; i < values.length; i++) out += piece(values[i]) + (strings[i + 1] ?? '');
  return new SafeHtml(out, MINT);
}

/** A console path with each segment and query value percent-encoded (empty query values left out). */
export function href(path: readonly string[], query: Record<string, string | number | undefined | null> = {}): string {
  const p = '/console/' + path.map((s) => encodeURIComponent(s)).join('/');
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  const qs = q.toString();
  return qs === '' ? p : `${p}?${qs}`;
}

/** A stored JSON value as text: strings as they are, anything else as its JSON, absent as empty. */
export function text(v: unknown): string {
  if (typeof v === 'string') return v;
  if (v === null || v === undefined) return '';
  return JSON.stringify(v);
}

/**
 * Characters a browser draws as nothing, or that reorder or reshape the text around them: format characters
 * (bidi embeddings, overrides and isolates, zero-width spaces and joiners, the byte-order mark, tag
 * characters), control characters but the newline, line and paragraph separators, variation selectors and the
 * Hangul fillers.
 */
const HIDDEN =
  /[\p{Cf}\p{Zl}\p{Zp}\u0000-\u0009\u000b-\u001f\u007f-\u009f\u115f\u1160\u3164\uffa0\ufe00-\ufe0f]|[\u{e0100}-\u{e01ef}]/gu;

/** Whether the text holds a character `visible` would mark. */
export function hasHidden(value: string): boolean {
  return new RegExp(HIDDEN.source, 'u').test(value);
}

/**
 * Text for reading, escaped like every interpolation, with each hidden character (see HIDDEN) shown as its
 * code (`\u202E`) in a marked span instead of being drawn, so what the reader sees is what is stored.
 * For text content only, never for an attribute value.
 */
export function visible(raw: string | undefined): SafeHtml {
  const value = raw ?? '';
  let out = '';
  let last = 0;
  for (const m of value.matchAll(HIDDEN)) {
    const cp = m[0].codePointAt(0) ?? 0;
    const code =
      cp > 0xffff ? `\\u{${cp.toString(16).toUpperCase()}}` : `\\u${cp.toString(16).toUpperCase().padStart(4, '0')}`;
    out += escapeHtml(value.slice(last, m.index));
    out += `<span class="hidden-char" title="a hidden character, shown as its code">${code}</span>`;
    last = m.index + m[0].length;
  }
  out += escapeHtml(value.slice(last));
  return new SafeHtml(out, MINT);
}
