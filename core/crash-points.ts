import { onRequestSent, type SentRequestMatch } from './request-sent.js';

/**
 * Named crash points for the fault-injection runs: the process SIGKILLs itself at the named point.
 * Armed only when `ACTIONLEDGER_CRASH_POINTS_ENABLED=1` and `ACTIONLEDGER_CRASH_AT` names the point
 * (optionally `name:N` to crash at the Nth time it is reached). Never armed in production configuration.
 */
export const CRASH_POINTS = [
  'after_claim',
  'after_authorization_request',
  'after_evidence_commit',
  'after_provider_request_sent',
  'after_response_before_outcome',
  'after_outcome_commit',
  // the reconciler's
  'reconcile_after_readback',
  'reconcile_after_commit',
] as const;
export type CrashPoint = (typeof CRASH_POINTS)[number];

export class CrashPoints {
  readonly #target: CrashPoint | null;
  readonly #at: number;
  #seen = 0;

  constructor(env: NodeJS.ProcessEnv) {
    const spec = env.ACTIONLEDGER_CRASH_POINTS_ENABLED === '1' ? env.ACTIONLEDGER_CRASH_AT : undefined;
    const [name, n] = (spec ?? '').split(':');
    this.#target = CRASH_POINTS.includes(name as CrashPoint) ? (name as CrashPoint) : null;
    this.#at = n === undefined ? 1 : Math.max(1, Number(n) || 1);
  }

  reach(point: CrashPoint): void {
    if (point !== this.#target) return;
    if (++this.#seen === this.#at) process.kill(process.pid, 'SIGKILL');
  }

  /**
   * Runs `call` and reaches `point` at the moment undici has written the request that `sent` describes (headers
   * and body handed to the socket; see {@link onRequestSent}), not on a timer: a crash there is always after
   * the request left and before its response was read. When `point` is not the armed one, just runs `call`
   * (no diagnostics subscription in production). A request that was never written never reaches the point.
   */
  async reachWhenSent<T>(point: CrashPoint, sent: SentRequestMatch, call: () => Promise<T>): Promise<T> {
    if (point !== this.#target) return call();
    const stop = onRequestSent(sent, () => this.reach(point));
    try {
      return await call();
    } finally {
      stop();
    }
  }
}
