/**
 * What the service does when its embedded PostgreSQL dies and comes back (embedded/cluster.ts supervises it):
 * log each step, and tell the workers at once (`changed`), so their probes say `database_restarting` before
 * anything reads the log line, not at the fleet's next health check.
 */
import type { Logger } from '../core/log.js';
import type { ClusterEvents } from '../embedded/index.js';

export function supervisionLog(log: Logger, changed: () => void, restarted: () => void): ClusterEvents {
  return {
    onDied: (info) => {
      changed();
      log.error(
        {
          code: 'embedded_database_failed',
          postmaster_pid: info.pid,
          exit_code: info.code,
          signal: info.signal,
          last_lines: info.tail.slice(-5),
        },
        'embedded PostgreSQL died; restarting it',
      );
    },
    // No try is the last: the service stays up (probes 503, API database_unavailable) and keeps trying.
    onRestartScheduled: (info) =>
      log.warn(
        { attempt: info.attempt, delay_ms: info.delayMs },
        `embedded PostgreSQL restart attempt ${info.attempt} in ${info.delayMs} ms`,
      ),
    onRestartFailed: (info) =>
      log.warn({ attempt: info.attempt, reason: info.message }, 'embedded PostgreSQL restart attempt failed'),
    onRestarted: (info) => {
      changed();
      log.warn(
        { postmaster_pid: info.pid, watchdog_pid: info.watchdogPid, attempt: info.attempt },
        'embedded PostgreSQL restarted',
      );
      restarted();
    },
  };
}
