/**
 * The gate step of compiling the configuration: each gated tool's argument schema checked (closed objects, no
 * identity arguments, ajv strict mode) and compiled, its value, approval, limits and resources checked against
 * that schema and its route. Problems are appended to the caller's list; the gate configuration is returned frozen.
 */
import { createRequire } from 'node:module';
import type { Ajv, ValidateFunction } from 'ajv';
import type { GateCap, GateConfig, GateTool } from './types.js';
import type { RawCap, RawConfig, RawGate, RawGateTool } from './schema.js';
import { isObject, nearest, pointer, type ConfigProblems } from '../core/config-problems.js';
import { IDENTITY_ARGUMENT_NAMES } from '../core/types.js';

/**
 * Tool argument schemas: strict mode (unknown keywords refused), every violation listed. Made by the first tool
 * schema compiled: loading ajv is a cost a configuration without gated tools need not pay.
 */
let ajv: Ajv | undefined;
function toolAjv(): Ajv {
  if (ajv === undefined) {
    const { Ajv: AjvClass } = createRequire(import.meta.url)('ajv') as typeof import('ajv');
    ajv = new AjvClass({ allErrors: true, strict: true });
  }
  return ajv;
}

/** The gate's configuration; null when the schema found `/gate` itself malformed (the problems say why). */
export function compileGate(raw: RawGate, routes: RawConfig['tools'], problems: ConfigProblems): GateConfig | null {
  if (!isObject(raw)) return null;
  const tools = new Map<string, GateTool>();
  for (const [name, t] of Object.entries(isObject(raw.tools) ? raw.tools : {})) {
    const where = pointer('gate', 'tools', name);
    if (!isObject(t)) continue;
    if (isObject(routes) && !Object.hasOwn(routes, name)) {
      const suggestion = nearest(name, Object.keys(routes));
      problems.add(where, 'has no provider route in /tools', suggestion === undefined ? {} : { suggestion });
    }
    const validate = problems.malformed(`${where}/schema`)
      ? refuseAll
      : compileArgumentSchema(where, t.schema, problems);
    toolProblems(where, t, problems);
    if (!problems.malformed(where)) tools.set(name, gateTool(name, t, raw, validate));
  }
  if (problems.malformed('/gate')) return null;
  return Object.freeze({
    policyVersion: raw.policy_version,
    directReservations: raw.direct_reservations,
    confirmationTtlS: raw.confirmation_ttl_s,
    decisionTtlS: raw.decision_ttl_s,
    tools,
  });
}

const refuseAll = (() => false) as unknown as ValidateFunction;

/** The tool's argument schema compiled; a schema with problems compiles to a validator that refuses everything. */
function compileArgumentSchema(
  where: string,
  schema: RawGateTool['schema'],
  problems: ConfigProblems,
): ValidateFunction {
  const before = problems.length;
  if (schema.type !== 'object') problems.add(`${where}/schema`, 'must have type: object');
  schemaProblems(schema, `${where}/schema`, problems);
  if (problems.length === before) {
    try {
      return toolAjv().compile(schema);
    } catch (err) {
      problems.add(`${where}/schema`, `does not compile in ajv strict mode: ${(err as Error).message}`);
    }
  }
  return refuseAll;
}

/**
 * Finds every object schema that is not closed (`additionalProperties: false`) and every property named like an
 * identity field: both are refused at start. Walks the keywords that hold subschemas.
 */
function schemaProblems(node: unknown, path: string, out: ConfigProblems): void {
  if (node === null || typeof node !== 'object') return;
  if (Array.isArray(node)) {
    node.forEach((n, i) => schemaProblems(n, `${path}/${i}`, out));
    return;
  }
  const o = node as Record<string, unknown>;
  const types = Array.isArray(o.type) ? o.type : [o.type];
  if ((types.includes('object') || 'properties' in o) && o.additionalProperties !== false) {
    out.add(path, 'is an object schema without additionalProperties: false');
  }
  if (o.properties !== null && typeof o.properties === 'object') {
    for (const name of Object.keys(o.properties)) {
      if ((IDENTITY_ARGUMENT_NAMES as readonly string[]).includes(name))
        out.add(
          `${path}/properties${pointer(name)}`,
          'declares an identity argument (authority comes from the trusted context)',
        );
    }
  }
  for (const [k, v] of Object.entries(o)) {
    if (k === 'enum' || k === 'const' || k === 'default' || k === 'examples') continue;
    schemaProblems(v, `${path}${pointer(k)}`, out);
  }
}

/**
 * The value, approval, limits and resources must name declared arguments and agree with one another. Each
 * check runs when the parts it reads passed the schema; the declared arguments are the schema's properties
 * (when the schema itself is malformed, the checks naming an argument are skipped).
 */
function toolProblems(where: string, t: RawGateTool, problems: ConfigProblems): void {
  const ok = (...paths: string[]): boolean => paths.every((p) => !problems.malformed(`${where}${p}`));
  const declared = ok('/schema') ? Object.keys(isObject(t.schema.properties) ? t.schema.properties : {}) : null;
  const argument = (path: string, name: string): void => {
    if (declared === null || !ok(path) || declared.includes(name)) return;
    const suggestion = nearest(name, declared);
    problems.add(`${where}${path}`, `names ${name}, which the schema does not declare`, {
      allowed: declared,
      ...(suggestion === undefined ? {} : { suggestion }),
    });
  };
  const v = ok('/value') ? t.value : undefined;
  if (v !== undefined) {
    argument('/value/argument', v.argument);
    if ((v.currency_argument === undefined) === (v.currency === undefined))
      problems.add(`${where}/value`, 'needs exactly one of currency_argument and currency');
    if (v.currency_argument !== undefined) argument('/value/currency_argument', v.currency_argument);
    if (v.currency !== undefined && v.limits_currency !== undefined && v.limits_currency !== v.currency)
      problems.add(`${where}/value/limits_currency`, 'differs from the fixed currency');
    const named = v.currency_argument;
    if (named !== undefined && v.limits_currency !== undefined && declared?.includes(named) === true)
      currencyProblems(`${where}/schema/properties${pointer(named)}`, t.schema, named, v.limits_currency, problems);
  }
  if (
    ok('/approval/mode', '/approval/threshold') &&
    t.approval.mode === 'threshold' &&
    (t.approval.threshold === undefined || t.value === undefined)
  )
    problems.add(`${where}/approval`, 'mode threshold needs a threshold and a value argument');
  // Without limits_currency a value-capped tool still loads (configurations written before it existed), but the
  // gate refuses its calls with config_invalid (fail closed) until one is declared.
  for (const [k, cap] of Object.entries(isObject(t.limits) ? t.limits : {})) {
    if (ok(`/limits/${k}/max_value`) && cap?.max_value !== undefined && t.value === undefined)
      problems.add(`${where}/limits/${k}/max_value`, 'needs a value argument');
  }
  if (Array.isArray(t.resources))
    t.resources.forEach((r, i) => argument(`/resources/${i}/id_argument`, r?.id_argument));
}

/**
 * A tool whose value caps and approval threshold are in one currency (`value.limits_currency`) refuses a call
 * in any other (gate/checks.ts): an argument schema admitting another currency invites calls that are refused
 * every time, so the currency argument must admit that currency alone (`const`, or an `enum` of it).
 */
function currencyProblems(
  path: string,
  schema: RawGateTool['schema'],
  name: string,
  limits: string,
  problems: ConfigProblems,
): void {
  const prop = (schema.properties as Record<string, unknown>)[name];
  const admitted = !isObject(prop)
    ? null
    : Object.hasOwn(prop, 'const')
      ? [prop.const]
      : Array.isArray(prop.enum)
        ? prop.enum
        : null;
  const fix = `the caps and approval threshold are in ${limits} (value.limits_currency), so a call in any other currency is refused: admit ${limits} alone ("enum": ["${limits}"])`;
  if (admitted === null) problems.add(path, `admits any currency; ${fix}`, { allowed: [limits] });
  else if (admitted.some((c) => c !== limits)) {
    const others = admitted.filter((c) => c !== limits).map((c) => JSON.stringify(c));
    problems.add(path, `admits ${others.join(', ')}; ${fix}`, { allowed: [limits] });
  }
}

function gateTool(name: string, t: RawGateTool, raw: RawGate, validate: ValidateFunction): GateTool {
  // Caps and the threshold are amounts in one currency: a call in another is refused, never counted apart.
  const valueCapped =
    t.approval.mode === 'threshold' || Object.values(t.limits).some((c) => c?.max_value !== undefined);
  return Object.freeze({
    name,
    description: t.description ?? '',
    schema: t.schema,
    validate,
    roles: Object.freeze(new Set(t.roles)),
    approverRoles: Object.freeze(new Set(t.approver_roles)),
    value:
      t.value === undefined
        ? null
        : Object.freeze({
            argument: t.value.argument,
            currencyArgument: t.value.currency_argument ?? null,
            currency: t.value.currency ?? null,
            limitsCurrency: t.value.currency ?? t.value.limits_currency ?? null,
            valueCapped,
          }),
    approval: Object.freeze({
      mode: t.approval.mode,
      threshold: t.approval.threshold ?? null,
      approvers: t.approval.approvers,
      ttlS: t.approval.ttl_s ?? (t.irreversible ? raw.irreversible_approval_ttl_s : raw.approval_ttl_s),
    }),
    irreversible: t.irreversible,
    validator: t.validator ?? null,
    resources: Object.freeze(t.resources.map((r) => Object.freeze({ type: r.type, idArgument: r.id_argument }))),
    redact: Object.freeze(new Set(t.redact)),
    effect: t.effect ?? null,
    rate: t.rate === undefined ? null : Object.freeze({ limit: t.rate.limit, windowS: t.rate.window_s }),
    limits: Object.freeze({
      perPrincipalDay: cap(t.limits.per_principal_day),
      perAccountDay: cap(t.limits.per_account_day),
      perConversation: cap(t.limits.per_conversation),
    }),
  });
}

const cap = (c: RawCap | undefined): GateCap | null =>
  c === undefined ? null : Object.freeze({ maxCount: c.max_count ?? null, maxValue: c.max_value ?? null });
