/**
 * Identifiers (tenants, principals, roles, tasks, steps, accounts): text compared byte for byte in SQL, so two
 * spellings of one name must not become two identities, and a name must not hide what it says. An identifier
 * is NFC-normalized, then refused when it is empty, only whitespace, longer than {@link MAX_CONTEXT_FIELD}, or
 * holds a control, format (bidi controls, zero-width characters, the byte-order mark) or unpaired surrogate.
 */
import { ActionLedgerError } from './errors.js';
import { MAX_CONTEXT_FIELD } from './types.js';

const FORBIDDEN = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/u;

/** Why the text is not an identifier, or null when it is one (after NFC). */
export function identifierProblem(value: unknown): string | null {
  if (typeof value !== 'string') return 'must be a string';
  if (!value.isWellFormed()) return 'holds an unpaired surrogate';
  const v = value.normalize('NFC');
  if (v.length === 0) return 'is empty';
  if (v.trim().length === 0) return 'is only whitespace';
  if (v.length > MAX_CONTEXT_FIELD) return `is longer than ${MAX_CONTEXT_FIELD} characters`;
  if (FORBIDDEN.test(v)) return 'holds a control, format, bidi-control or zero-width character';
  return null;
}

/** The NFC form of an identifier; throws `invalid_context` naming the field and the problem. */
export function identifier(field: string, value: unknown): string {
  const problem = identifierProblem(value);
  if (problem !== null)
    throw new ActionLedgerError('invalid_context', `${field} ${problem}`, { details: { field, problem } });
  return (value as string).normalize('NFC');
}
