/** What the `gate` subcommands share: their options and a gate over the configured database. */
import type { Runtime } from '../../core/runtime.js';
import type { Gate } from '../../gate/index.js';
import { load } from './load.js';
import { EXIT, printRefusal, stderrLog, type OptionSpec } from '../cli-util.js';

export const GATE_EXITS = [EXIT.ok, EXIT.refused, EXIT.usage];

export const TENANT: OptionSpec = { type: 'string', value: 'T', required: true, description: 'tenant of the approval' };
export const APPROVER: OptionSpec = {
  type: 'string',
  value: 'WHO',
  required: true,
  description: 'the reviewing person (principal id; audited)',
};
export const ROLE: OptionSpec = {
  type: 'string',
  value: 'ROLE',
  required: true,
  description: "the reviewer's role (must be allowed to approve this tool)",
};
export const ACTOR: OptionSpec = { type: 'string', value: 'WHO', required: true, description: 'who acts (audited)' };

/**
 * Runs `fn` with a gate over the configured database (migrated), then closes it; a refusal becomes one JSON
 * line on stdout and the exit code 1.
 */
export async function withGate(fn: (gate: Gate, rt: Runtime) => Promise<number>): Promise<number> {
  try {
    const [{ openRuntime }, { EffectKeyer, Ledger }, { Gate }] = await Promise.all([
      load.runtime(),
      load.ledger(),
      load.gate(),
    ]);
    const rt = await openRuntime({ name: 'gate', migrate: true, defaultMetrics: false, logDestination: stderrLog() });
    const ledger = new Ledger(rt.config, rt.pool, new EffectKeyer(rt.effectKeys));
    try {
      const gate = new Gate({
        config: rt.config,
        pool: rt.pool,
        ledger,
        withoutValidators: true,
        withoutResolvers: true,
      });
      return await fn(gate, rt);
    } finally {
      ledger.stop();
      await rt.close();
    }
  } catch (err) {
    return printRefusal(err);
  }
}
