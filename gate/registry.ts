/**
 * The tools the gate knows (from the configuration) and the code the embedding application registers for
 * them: business validators and resource resolvers. Refuses to be built when a configured validator or
 * resolver is missing, so a bad registry fails at start, not at the first call.
 */
import type { Config, GateTool } from '../config/index.js';
import type { Queryable } from '../db/index.js';
import { ActionLedgerError } from '../core/errors.js';
import type { JsonObject } from '../core/json.js';
import { refuse } from './refusal.js';
import type { BoundResource, BusinessValidator, GateContext, ResourceResolver } from './types.js';

export interface GateRegistryOptions {
  validators?: Readonly<Record<string, BusinessValidator>> | undefined;
  resolvers?: Readonly<Record<string, ResourceResolver>> | undefined;
  /** The authorization service never runs business validators, so it need not register them. */
  withoutValidators?: boolean | undefined;
  /**
   * The operator CLI has no resolvers: approving a tool that binds resources is then refused with
   * `config_invalid` (before the vote is recorded) instead of refusing to start.
   */
  withoutResolvers?: boolean | undefined;
}

export class GateRegistry {
  readonly validators: Readonly<Record<string, BusinessValidator>>;
  readonly resolvers: Readonly<Record<string, ResourceResolver>>;
  readonly #config: Config;

  /** Throws `config_invalid` listing every configured validator or resolver that is not registered. */
  constructor(config: Config, options: GateRegistryOptions = {}) {
    this.#config = config;
    this.validators = options.validators ?? {};
    this.resolvers = options.resolvers ?? {};
    const problems: string[] = [];
    for (const tool of config.gate.tools.values()) {
      if (options.withoutValidators !== true && tool.validator !== null && this.validator(tool.validator) === undefined)
        problems.push(`/gate/tools/${tool.name}/validator names ${tool.validator}, which is not registered`);
      for (const r of tool.resources)
        if (options.withoutResolvers !== true && this.resolver(r.type) === undefined)
          problems.push(`/gate/tools/${tool.name}/resources: no resolver registered for type ${r.type}`);
    }
    if (problems.length > 0)
      throw new ActionLedgerError('config_invalid', `gate registry is incomplete:\n  - ${problems.join('\n  - ')}`, {
        details: { problems },
      });
  }

  tool(name: string): GateTool | undefined {
    return this.#config.gate.tools.get(name);
  }

  /**
   * The registered validator of that name. Own functions only: a configured name like `toString` or
   * `constructor` must not find what every object inherits and pass for registered.
   */
  validator(name: string): BusinessValidator | undefined {
    const v: unknown = Object.hasOwn(this.validators, name) ? this.validators[name] : undefined;
    return typeof v === 'function' ? (v as BusinessValidator) : undefined;
  }

  /** The registered resolver of that resource type (own functions only, as {@link validator}). */
  resolver(type: string): ResourceResolver | undefined {
    const r: unknown = Object.hasOwn(this.resolvers, type) ? this.resolvers[type] : undefined;
    return typeof r === 'function' ? (r as ResourceResolver) : undefined;
  }

  /** Runs the tool's business validator (if any); throws its refusal, or `config_invalid` when it is missing. */
  async validateBusiness(db: Queryable, tool: GateTool, ctx: GateContext, args: JsonObject): Promise<void> {
    if (tool.validator === null) return;
    const validator = this.validator(tool.validator);
    if (validator === undefined)
      throw new ActionLedgerError(
        'config_invalid',
        `${tool.name} needs its business validator ${tool.validator}, which this process does not run (the command line runs none); nothing was reserved: call it through the service that registers it`,
      );
    const verdict = await validator({
      context: Object.freeze({ ...ctx }),
      tool: tool.name,
      args: Object.freeze({ ...args }),
      db,
    });
    if (!verdict.ok) throw refuse(verdict.error, verdict.message);
  }

  /**
   * The current version of every resource the call binds, in the tool's order; null when one cannot be
   * resolved. Throws `config_invalid` when a resolver is not registered.
   */
  async resolveResources(
    db: Queryable,
    tool: GateTool,
    tenant: string,
    args: JsonObject,
  ): Promise<BoundResource[] | null> {
    const out: BoundResource[] = [];
    for (const r of tool.resources) {
      const id = args[r.idArgument];
      const resolver = this.resolver(r.type);
      if (resolver === undefined)
        throw new ActionLedgerError(
          'config_invalid',
          `${tool.name} binds resources of type ${r.type}, which this process cannot resolve (the command line has no resolvers); nothing was recorded: do this through the service that registers them`,
        );
      if (typeof id !== 'string' && typeof id !== 'number') return null;
      const version = await resolver({ tenant_id: tenant, id: String(id), db });
      if (version === null) return null;
      out.push({ type: r.type, id: String(id), version: String(version) });
    }
    return out;
  }
}
