/**
 * Builds a compensation's arguments from the registry's declared mapping: each argument comes from the
 * original's stored arguments (an RFC 6901 pointer), its receipt, its operation id or effect key, or a
 * literal. A missing source is an error, never a guess: the compensator then sends the original to review.
 */
import type { CompensationMapping } from '../config/index.js';
import { ActionLedgerError } from '../core/errors.js';
import type { JsonValue } from '../core/json.js';

export interface CompensationSourceRow {
  operation_id: string;
  effect_key: string;
  provider_receipt: string | null;
  arguments_json: JsonValue;
}

/** Resolves an RFC 6901 pointer; undefined when any step is missing. */
export function resolvePointer(doc: JsonValue, pointer: string): JsonValue | undefined {
  if (pointer === '') return doc;
  let cur: JsonValue | undefined = doc;
  for (const raw of pointer.slice(1).split('/')) {
    const token = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    if (Array.isArray(cur)) {
      if (!/^(0|[1-9][0-9]*)$/.test(token)) return undefined;
      cur = cur[Number(token)];
    } else if (cur !== null && typeof cur === 'object') {
      cur = Object.hasOwn(cur, token) ? (cur as Record<string, JsonValue>)[token] : undefined;
    } else return undefined;
    if (cur === undefined) return undefined;
  }
  return cur;
}

/** Throws `compensation_unmapped` naming every argument it could not source. */
export function compensationArguments(
  mapping: CompensationMapping,
  original: CompensationSourceRow,
): Record<string, JsonValue> {
  const out: Record<string, JsonValue> = {};
  const missing: string[] = [];
  for (const [name, src] of Object.entries(mapping.arguments)) {
    let v: JsonValue | undefined;
    if ('value' in src) v = src.value as JsonValue;
    else if (src.from === 'arguments') v = resolvePointer(original.arguments_json, src.pointer);
    else if (src.from === 'receipt') v = original.provider_receipt ?? undefined;
    else if (src.from === 'operation_id') v = original.operation_id;
    else v = original.effect_key;
    if (v === undefined) missing.push(name);
    else out[name] = v;
  }
  if (missing.length > 0) {
    throw new ActionLedgerError(
      'compensation_unmapped',
      `the compensation mapping has no source value for: ${missing.join(', ')}`,
      { details: { missing } },
    );
  }
  return out;
}
