/**
 * Identifiers (tenants, principals, roles, tasks, steps, accounts): text compared byte for byte in SQL, so two
 * spellings of one name must not become two identities, and a name must not hide what it says. An identifier
 * is NFC-normalized, then refused when it is empty, only whitespace, begins or ends with whitespace, longer than
 * {@link MAX_CONTEXT_FIELD}, or holds a control, format (bidi controls, zero-width characters, the byte-order
 * mark), a space other than U+0020, or an unpaired surrogate.
 */
import { ActionLedgerError } from './errors.js';
import { MAX_CONTEXT_FIELD } from './types.js';

// Spaces other than U+0020 (no-break, ideographic, en/em...) look like a space or like nothing at all.
const FORBIDDEN = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]/u;

/** Why the text is not an identifier, or null when it is one (after NFC). */
export function identifierProblem(value: unknown): string | null {
  if (typeof value !== 'string') return 'must be a string';
  if (!value.isWellFormed()) return 'holds an unpaired surrogate';
  const v = value.normalize('NFC');
  if (v.length === 0) return 'is empty';
  if (v.trim().length === 0) return 'is only whitespace';
  // "alice " and "alice" would be two identities that display as one (a requester approving itself).
  if (v.trim() !== v) return 'begins or ends with whitespace';
  if (v.length > MAX_CONTEXT_FIELD) return `is longer than ${MAX_CONTEXT_FIELD} characters`;
  if (FORBIDDEN.test(v))
    return 'holds a control, format, bidi-control or zero-width character, or a space other than U+0020';
  return null;
}

/** The NFC form of an identifier; throws `invalid_context` naming the field and the problem. */
export function identifier(field: string, value: unknown): string {
  const problem = identifierProblem(value);
  if (problem !== null)
    throw new ActionLedgerError('invalid_context', `${field} ${problem}`, { details: { field, problem } });
  return (value as string).normalize('NFC');
}
