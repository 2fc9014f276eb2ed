/**
 * The console's one escaping function and the tagged template built on it. Every `${value}` in an `html`
 * template is escaped (`&`, `<`, `>`, `"`, `'` and the backtick become entities) unless it is itself the
 * result of an `html` template; arrays are joined, null and undefined are empty. Nothing that came from
 * arguments, names or reasons can therefore become markup, whether it lands in text or in a quoted attribute.
 * Attribute values are always written in double quotes by the templates; URLs are built with `href()`, which
 * percent-encodes each part, so no value can start a `javascript:` URL. No interpolation draws a character a
 * reader would not see as written (core/visible-text.ts): it shows as its code, `\u202E`. Text for reading
 * (`visible()`) that holds right-to-left characters is drawn in the order it is stored.
 */
import { hasRightToLeft, revealHidden } from '../../core/visible-text.js';

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
  // No interpolation draws a hidden character: it shows its code, marked where the template asks (visible()).
  return revealHidden(String(v), (code) => code, escapeHtml);
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
 * Text for reading, escaped like every interpolation, with each hidden character (core/visible-text.ts) shown
 * as its code (`\u202E`) in a marked span instead of being drawn, so what the reader sees is what is stored.
 * Text that holds right-to-left characters, which would reorder the digits and words around them
 * (`IBAN \u05D0 1234 5678` drawn as `IBAN 5678 1234 \u05D0`), is drawn left to right in the order it is stored
 * (`<bdo dir="ltr">`, and `unicode-bidi: bidi-override; direction: ltr` in the stylesheet), marked.
 * For text content only, never for an attribute value (where every interpolation shows the bare code).
 */
export function visible(raw: string | undefined): SafeHtml {
  const shown = revealHidden(
    raw ?? '',
    (code) => `<span class="hidden-char" title="a hidden character, shown as its code">${code}</span>`,
    escapeHtml,
  );
  return new SafeHtml(
    hasRightToLeft(raw ?? '')
      ? `<bdo dir="ltr" class="logical-order" title="right-to-left text, shown in the order it is stored">${shown}</bdo>`
      : shown,
    MINT,
  );
}
