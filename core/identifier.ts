/**
 * Identifiers (tenants, principals, roles, tasks, steps, accounts): text compared byte for byte in SQL, so two
 * spellings of one name must not become two identities, and a name must not hide what it says. An identifier
 * is NFC-normalized, then refused when it is empty, only whitespace, begins or ends with whitespace, longer than
 * {@link MAX_CONTEXT_FIELD}, or holds a character a person would not read as written (the set of
 * core/visible-text.ts, from Unicode's properties: default-ignorable, bidi-control, format, control, unassigned,
 * private-use, blank-drawn, a combining overlay or a mark on a digit), a right-to-left character (an identifier
 * is shown to approvers inside other text, where one would reorder the digits and words around it: `acct 1234
 * \u05D0 5678`), a space other than U+0020, or an unpaired surrogate.
 */
import { ActionLedgerError } from './errors.js';
import { MAX_CONTEXT_FIELD } from './types.js';
import { IDENTIFIER_FORBIDDEN, RIGHT_TO_LEFT, hasHiddenCharacters, hiddenCode } from './visible-text.js';

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
  const bad = IDENTIFIER_FORBIDDEN.exec(v);
  if (bad === null) return null;
  const at = `holds ${hiddenCode(bad[0].codePointAt(0) ?? 0)} at ${bad.index}`;
  if (RIGHT_TO_LEFT.test(bad[0]) && !hasHiddenCharacters(bad[0]))
    return `${at}: a right-to-left character, which reorders the text around it on screen`;
  return `${at}: a hidden, control, format, bidi-control, zero-width, private-use or unassigned character, a combining overlay or mark on a digit, or a space other than U+0020`;
}

/** The NFC form of an identifier; throws `invalid_context` naming the field and the problem. */
export function identifier(field: string, value: unknown): string {
  const problem = identifierProblem(value);
  if (problem !== null)
    throw new ActionLedgerError('invalid_context', `${field} ${problem}`, { details: { field, problem } });
  return (value as string).normalize('NFC');
}
