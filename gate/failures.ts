/** How a gate decision that failed (not refused) is answered and logged: its coded error, never a stack. */
import { ActionLedgerError, asActionLedgerError, type ErrorCode } from '../core/errors.js';
import { RepeatedFailureLog, type Logger } from '../core/log.js';

/** The codes of a decision that failed on the database. */
const DATABASE_CODES: ReadonlySet<ErrorCode> = new Set<ErrorCode>([
  'database_unavailable',
  'storage_full',
  'statement_timeout',
  'database_overloaded',
  'database_conflict',
  'database_read_only',
  'database_error',
  'audit_unavailable',
]);

export class DecisionFailures {
  readonly #log: Logger;
  readonly #database: RepeatedFailureLog;

  constructor(log: Logger) {
    this.#log = log;
    this.#database = new RepeatedFailureLog(log, 'gate decision failed on the database; refused with its code');
  }

  /**
   * The coded refusal a failed decision answers with; a database failure is logged with its SQLSTATE (once
   * per interval per code: an agent retrying against a full disk would otherwise write a line per call).
   */
  failed(err: unknown, fields: Record<string, unknown>): ActionLedgerError {
    const coded = asActionLedgerError(err);
    if (coded.code === 'internal')
      this.#log.error({ ...fields, err }, 'gate decision failed unexpectedly; refused as internal');
    else if (DATABASE_CODES.has(coded.code))
      this.#database.fail(err, {
        ...fields,
        error_code: coded.code,
        sqlstate: coded.details?.sqlstate ?? null,
      });
    return coded;
  }
}
