/**
 * The raw configuration type is derived from the JSON schema (json-schema-to-ts), not written beside it. These
 * assertions are checked by the compiler (`npm run typecheck` fails when one is false) and pin what the
 * derivation must give: defaulted fields present, optional ones optional, enumerations as unions that match the
 * compiled types. The runtime part shows ajv's defaults fill in every field the type says is present.
 */
import t from 'tap';
import { Ajv } from 'ajv';
import { configSchema, type RawCap, type RawConfig, type RawGateTool, type RawTool } from '../../config/schema.js';
import type { ApprovalMode, CompensationSource, GateConfig } from '../../config/index.js';

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
type Assert<T extends true> = T;
type IsOptional<T, K extends keyof T> = object extends Pick<T, K> ? true : false;

export type Checks = [
  // Sections with a default are always there after validation; so are their defaulted fields.
  Assert<
    Equal<
      keyof RawConfig,
      | 'schema'
      | 'cluster'
      | 'tenant_clusters'
      | 'http'
      | 'api'
      | 'database'
      | 'effect_keys'
      | 'arguments'
      | 'tools'
      | 'dispatcher'
      | 'reconciler'
      | 'sandbox'
      | 'gate'
      | 'notifications'
      | 'review_policies'
      | '$comment'
    >
  >,
  Assert<Equal<IsOptional<RawConfig, 'http'>, false>>,
  Assert<
    Equal<
      RawConfig['http'],
      {
        host: string;
        port: number;
        tls?: { cert_file: string; key_file: string; client_ca_file?: string };
        allow_plaintext_bind: boolean;
        write_probe_interval_ms: number;
      }
    >
  >,
  Assert<Equal<RawConfig['api']['permissions']['reserve'], string[]>>,
  Assert<Equal<RawConfig['dispatcher']['concurrency'], number>>,
  Assert<Equal<IsOptional<RawConfig['dispatcher'], 'concurrency'>, false>>,
  // Without a default a field stays optional: no profile means the sandbox's, or none.
  Assert<Equal<IsOptional<RawConfig['dispatcher'], 'profile'>, true>>,
  Assert<Equal<IsOptional<RawTool, 'readback'>, true>>,
  Assert<Equal<IsOptional<RawTool, 'credential_env'>, true>>,
  Assert<Equal<RawTool['idempotency'], { mechanism: 'header'; name: string }>>,
  Assert<Equal<RawTool['definitive_failure_statuses'], number[]>>,
  // Enumerations become the unions the compiled configuration uses.
  Assert<Equal<RawGateTool['approval']['mode'], ApprovalMode>>,
  Assert<Equal<RawConfig['gate']['direct_reservations'], GateConfig['directReservations']>>,
  // A compensation argument's source is one of those the compensator reads.
  Assert<
    Equal<
      Extract<CompensationArgument, { from: string }>['from'],
      CompensationSource extends infer S ? (S extends { from: infer F } ? F : never) : never
    >
  >,
  // A referenced definition ($defs/cap) is resolved, not `unknown`.
  Assert<Equal<RawCap, { max_count?: number; max_value?: number }>>,
];
type CompensationArgument = NonNullable<RawTool['compensation']>['arguments'][string];

t.test('ajv fills in every field the derived type says is present', (t) => {
  const validate = new Ajv({ allErrors: true, strict: true, useDefaults: true }).compile<RawConfig>(configSchema);
  const raw: unknown = { tools: {} };
  t.ok(validate(raw), 'the smallest configuration is valid');
  const cfg = raw as RawConfig;
  const sections: Record<Exclude<keyof RawConfig, '$comment' | 'cluster'>, unknown> = {
    schema: cfg.schema,
    tenant_clusters: cfg.tenant_clusters,
    http: cfg.http,
    api: cfg.api,
    database: cfg.database,
    effect_keys: cfg.effect_keys,
    arguments: cfg.arguments,
    tools: cfg.tools,
    dispatcher: cfg.dispatcher,
    reconciler: cfg.reconciler,
    sandbox: cfg.sandbox,
    gate: cfg.gate,
    notifications: cfg.notifications,
    review_policies: cfg.review_policies,
  };
  for (const [name, value] of Object.entries(sections)) t.not(value, undefined, `${name} is filled in`);
  t.type(cfg.http.port, 'number');
  t.type(cfg.dispatcher.concurrency, 'number');
  t.type(cfg.reconciler.schedule, 'string');
  t.type(cfg.gate.policy_version, 'string');
  t.equal(cfg.dispatcher.profile, undefined, 'no default for the profile: it stays absent');
  t.end();
});
