/**
 * `gate`: what people do at the gate from a terminal. Approve or reject an approval (by id and the envelope
 * hash shown by `gate show`), engage, lift or list kill switches, revoke or restore a role, expire due
 * approvals. Every action is audited like the library's. The CLI runs no business validators or resource
 * resolvers (those live in the embedding service): approving a tool that binds resources is refused with
 * `config_invalid` here, before the vote is recorded; approve it through the library.
 */
import { parseArgs } from 'node:util';
import { openRuntime } from '../../core/runtime.js';
import { EffectKeyer, Ledger } from '../../ledger/index.js';
import { Gate } from '../../gate/index.js';
import { printJson, printRefusal, stderrLog, table, usageError, type Command } from '../cli-util.js';

const USAGE = `actionledger gate show APPROVAL_ID --tenant T
       actionledger gate approve APPROVAL_ID --hash SHA256 --tenant T --approver WHO --role ROLE
       actionledger gate reject APPROVAL_ID --reason WHY --tenant T --approver WHO --role ROLE
       actionledger gate kill-switch engage|lift --tenant T|'*' --tool NAME|'*' --actor WHO [--reason WHY]
       actionledger gate kill-switch list
       actionledger gate revoke-role|restore-role --tenant T --principal P --role ROLE --actor WHO
       actionledger gate expire`;

const OPTIONS = Object.fromEntries(
  ['tenant', 'hash', 'approver', 'role', 'reason', 'tool', 'actor', 'principal'].map((k) => [
    k,
    { type: 'string' as const },
  ]),
);

export const gateCommand: Command = {
  summary:
    'approve / reject approvals, kill switches, role revocations, expire due approvals and proposals and prune rate windows (audited)',
  usage: USAGE,
  // eslint-disable-next-line max-lines-per-function -- one switch over the gate subcommands, each a few lines next to its usage check
  async run(argv) {
    let values: Record<string, string | boolean | undefined>;
    let positionals: string[];
    try {
      ({ values, positionals } = parseArgs({
        args: argv,
        options: { ...OPTIONS, json: { type: 'boolean' } },
        allowPositionals: true,
      }));
    } catch (err) {
      return usageError('gate', (err as Error).message, USAGE);
    }
    const [action, target, extra] = positionals;
    const need = (...keys: string[]): string | null => {
      const missing = keys.filter((k) => typeof values[k] !== 'string' || values[k] === '');
      return missing.length === 0 ? null : `missing --${missing.join(', --')}`;
    };
    const v = (k: string): string => String(values[k] ?? '');
    let problem: string | null;
    switch (action) {
      case 'show':
        problem = target === undefined ? 'expected an APPROVAL_ID' : need('tenant');
        break;
      case 'approve':
        problem = target === undefined ? 'expected an APPROVAL_ID' : need('hash', 'tenant', 'approver', 'role');
        break;
      case 'reject':
        problem = target === undefined ? 'expected an APPROVAL_ID' : need('reason', 'tenant', 'approver', 'role');
        break;
      case 'kill-switch':
        problem =
          target === 'list'
            ? null
            : target === 'engage' || target === 'lift'
              ? need('tenant', 'tool', 'actor', ...(target === 'engage' ? ['reason'] : []))
              : 'expected engage, lift or list';
        break;
      case 'revoke-role':
      case 'restore-role':
        problem = need('tenant', 'principal', 'role', 'actor');
        break;
      case 'expire':
        problem = null;
        break;
      default:
        problem = 'expected show, approve, reject, kill-switch, revoke-role, restore-role or expire';
    }
    if (problem === null && extra !== undefined) problem = `unexpected ${extra}`;
    if (problem !== null) return usageError('gate', problem, USAGE);
    try {
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
        const reviewer = { tenant_id: v('tenant'), principal_id: v('approver'), role: v('role') };
        const id = target ?? '';
        switch (action) {
          case 'show':
            printJson({ ok: true, ...(await gate.approvals.show(id, reviewer)) });
            return 0;
          case 'approve':
          case 'reject': {
            const r =
              action === 'approve'
                ? await gate.approve(id, v('hash'), reviewer)
                : await gate.reject(id, reviewer, v('reason'));
            printJson(r);
            return r.ok ? 0 : 1;
          }
          case 'kill-switch':
            if (target === 'list') {
              const { rows } = await rt.pool.query<{
                tenant_id: string;
                tool_name: string;
                engaged_at: Date;
                engaged_by: string;
                reason: string;
              }>(gate.core.q.killSwitchList);
              if (values.json === true) printJson({ ok: true, kill_switches: rows });
              else
                process.stdout.write(
                  `${table([['tenant', 'tool', 'engaged at', 'by', 'reason'], ...rows.map((r) => [r.tenant_id, r.tool_name, r.engaged_at.toISOString(), r.engaged_by, r.reason])])}\n`,
                );
              return 0;
            }
            if (target === 'engage') {
              const waited = await gate.engageKillSwitch(v('tenant'), v('tool'), v('actor'), v('reason'));
              printJson({ ok: true, tenant_id: v('tenant'), tool_name: v('tool'), engaged: true, ...waited });
              return 0;
            }
            if (!(await gate.liftKillSwitch(v('tenant'), v('tool'), v('actor')))) {
              printJson({ ok: false, error: 'not_found', message: 'no such kill switch is engaged' });
              return 1;
            }
            printJson({ ok: true, tenant_id: v('tenant'), tool_name: v('tool'), engaged: false });
            return 0;
          case 'revoke-role':
          case 'restore-role':
            if (action === 'revoke-role') await gate.revokeRole(v('tenant'), v('principal'), v('role'), v('actor'));
            else await gate.restoreRole(v('tenant'), v('principal'), v('role'), v('actor'));
            printJson({ ok: true });
            return 0;
          default:
            printJson({ ok: true, ...(await gate.housekeeping()) });
            return 0;
        }
      } finally {
        ledger.stop();
        await rt.close();
      }
    } catch (err) {
      return printRefusal(err);
    }
  },
};
