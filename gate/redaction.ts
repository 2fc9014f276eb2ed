/**
 * What the audit log may keep of a call: its arguments with the tool's `redact` keys replaced, and every text
 * made storable by PostgreSQL (no U+0000, no lone surrogates). Arguments that are not plain JSON are not
 * copied at all: the row says why instead.
 */
import type { GateTool } from '../config/index.js';
import type { JsonBounds } from '../core/json.js';

export const REDACTED = '[redacted]';

/**
 * The copy of a call's arguments the audit log keeps: every key the tool lists in `redact` replaced by
 * "[redacted]" at any depth (objects inside arrays too). Null for an unknown tool (no redaction policy).
 * Arguments that are not plain JSON jsonb can store (U+0000, lone surrogates, cycles, class instances,
 * non-finite numbers, nesting past the argument depth bound, over the size bound) are not copied at all:
 * `omitted` says why, and the row carries that marker instead.
 */
export function auditArguments(
  tool: GateTool | undefined,
  args: unknown,
  bounds: JsonBounds,
): { value: unknown; omitted?: string } {
  if (tool === undefined || args === undefined) return { value: null };
  try {
    const value = auditCopy(args, tool.redact, 1, bounds.maxDepth, new Set());
    if (Buffer.byteLength(JSON.stringify(value), 'utf8') > bounds.maxBytes)
      return { value: null, omitted: 'too_large' };
    return { value };
  } catch (err) {
    if (err instanceof Unstorable) return { value: null, omitted: err.message };
    return { value: null, omitted: 'not_json' };
  }
}

/** Text PostgreSQL stores: U+0000 and lone surrogates written as their JSON escapes (`\u0000`), else as is. */
export function safeText(v: string): string {
  return v.isWellFormed() && !v.includes('\u0000') ? v : JSON.stringify(v).slice(1, -1);
}

/** A detail object with every string made storable (our own shallow objects; deeper levels become text). */
export function safeDetail(v: unknown, depth = 0): unknown {
  if (typeof v === 'string') return safeText(v);
  if (typeof v === 'number') return Number.isFinite(v) ? v : String(v);
  if (v === null || typeof v === 'boolean') return v;
  // eslint-disable-next-line @typescript-eslint/no-base-to-string -- left here: bigint, symbol, function, whose String form is the text wanted
  if (typeof v !== 'object') return v === undefined ? null : safeText(String(v));
  if (depth >= 8) return '[too deep]';
  if (Array.isArray(v)) return v.map((x) => safeDetail(x, depth + 1));
  return Object.fromEntries(
    Object.entries(v as Record<string, unknown>).map(([k, x]) => [safeText(k), safeDetail(x, depth + 1)]),
  );
}

class Unstorable extends Error {}

function auditCopy(
  value: unknown,
  redact: ReadonlySet<string>,
  depth: number,
  maxDepth: number,
  seen: Set<object>,
): unknown {
  switch (typeof value) {
    case 'string':
      if (!value.isWellFormed() || value.includes('\u0000')) throw new Unstorable('unstorable_text');
      return value;
    case 'number':
      if (!Number.isFinite(value)) throw new Unstorable('not_json');
      return value;
    case 'boolean':
      return value;
    case 'object':
      break;
    default:
      throw new Unstorable('not_json');
  }
  if (value === null) return null;
  if (depth > maxDepth) throw new Unstorable('too_deep');
  if (seen.has(value)) throw new Unstorable('not_json');
  seen.add(value);
  let out: unknown;
  if (Array.isArray(value)) {
    const arr: unknown[] = [];
    for (let i = 0; i < value.length; i++) arr.push(auditCopy(value[i], redact, depth + 1, maxDepth, seen));
    out = arr;
  } else {
    const proto = Object.getPrototypeOf(value) as unknown;
    if (proto !== Object.prototype && proto !== null) throw new Unstorable('not_json');
    const obj: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
      if (!k.isWellFormed() || k.includes('\u0000')) throw new Unstorable('unstorable_text');
      if (k === '__proto__') throw new Unstorable('not_json');
      obj[k] = redact.has(k) ? REDACTED : auditCopy(v, redact, depth + 1, maxDepth, seen);
    }
    out = obj;
  }
  seen.delete(value);
  return out;
}
