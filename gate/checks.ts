/**
 * The checks of a call that need no database: the trusted context, the arguments (bounds, identity fields, the
 * tool's schema, the canonical form) and the value a call carries. Each throws a {@link Refused} naming what
 * is wrong, so the pipeline stops at the first refusal.
 */
import type { GateTool } from '../config/index.js';
import { ActionLedgerError } from '../core/errors.js';
import { canonicalArguments, sha256Hex, type JsonBounds, type JsonObject } from '../core/json.js';
import { identifierProblem } from '../core/identifier.js';
import { IDENTITY_ARGUMENT_NAMES, MAX_CONTEXT_FIELD } from '../core/types.js';
import { refuse } from './refusal.js';
import { GATE_CONTEXT_FIELDS, type GateContext, type Reviewer } from './types.js';

/** The longest text a context field may hold (and the longest the audit log keeps of one). */
export { MAX_CONTEXT_FIELD };

export interface CheckedArgs {
  args: JsonObject;
  canonical: string;
  sha256: string;
}

export interface Value {
  amount: string;
  currency: string;
}

/**
 * Checks the gate's trusted context and returns it with every field NFC-normalized (core/identifier.ts), so two
 * spellings of one name are one identity. Throws `invalid_context` naming the first bad field in the message
 * and `details.field` (with its problem), and every bad field in `details.fields`.
 */
export function checkGateContext(ctx: unknown): GateContext {
  const fields: string[] = [...GATE_CONTEXT_FIELDS];
  if (ctx !== null && typeof ctx === 'object' && (ctx as Record<string, unknown>).plan_version !== undefined)
    fields.push('plan_version');
  return identifiers(ctx, fields) as unknown as GateContext;
}

/**
 * Checks the identity of a person acting on an approval (tenant, principal, role) the same way, so the
 * requester cannot pass for another approver by spelling their name differently. Returns the NFC form.
 */
export function checkReviewer(reviewer: unknown): Reviewer {
  return identifiers(reviewer, ['tenant_id', 'principal_id', 'role']) as unknown as Reviewer;
}

/** The named fields of `value`, each an identifier in its NFC form; throws `invalid_context` as described above. */
function identifiers(value: unknown, fields: readonly string[]): Record<string, string> {
  if (value === null || typeof value !== 'object') throw refuse('invalid_context', 'trusted context must be an object');
  const given = value as Record<string, unknown>;
  const bad: string[] = [];
  let first: { field: string; problem: string } | undefined;
  const out: Record<string, string> = {};
  for (const f of fields) {
    const problem = given[f] === undefined ? 'is missing' : identifierProblem(given[f]);
    if (problem === null) out[f] = (given[f] as string).normalize('NFC');
    else {
      bad.push(f);
      first ??= { field: f, problem };
    }
  }
  if (first !== undefined)
    throw refuse('invalid_context', `trusted context field ${first.field} ${first.problem}`, {
      details: { field: first.field, problem: first.problem, fields: bad },
    });
  return out;
}

/**
 * Schema (ajv strict), identity fields, then plain-JSON bounds; throws `invalid_arguments` naming the
 * violation. Returns the canonical form, its hash, and the arguments parsed back from it.
 */
export function checkArguments(tool: GateTool, args: unknown, bounds: JsonBounds): CheckedArgs {
  // Bounds first: the walk below (and ajv) must never meet nesting deeper than the argument bound.
  const tooDeep = depthExceeds(args, bounds.maxDepth);
  if (tooDeep !== null)
    throw refuse('invalid_arguments', `arguments nest deeper than the bound of ${bounds.maxDepth} at ${tooDeep}`, {
      details: { path: tooDeep, problem: 'nest deeper than the bound' },
    });
  const identity = findIdentityField(args, '$');
  if (identity !== null) {
    throw refuse(
      'invalid_arguments',
      `argument ${identity} names an identity; authority comes from the session, not from arguments`,
      { details: { path: identity } },
    );
  }
  if (!tool.validate(args)) {
    const errors = (tool.validate.errors ?? []).map((e) => {
      const at = e.instancePath === '' ? '(arguments)' : e.instancePath;
      const extra =
        e.keyword === 'additionalProperties'
          ? ` (${String((e.params as { additionalProperty: string }).additionalProperty)})`
          : '';
      return `${at} ${e.message ?? 'is invalid'}${extra}`;
    });
    throw refuse('invalid_arguments', `arguments do not match the ${tool.name} schema: ${errors.join('; ')}`, {
      details: { violations: errors },
    });
  }
  let canonical: string;
  try {
    canonical = canonicalArguments(args, bounds);
  } catch (err) {
    if (err instanceof ActionLedgerError)
      throw refuse('invalid_arguments', err.message, err.details === undefined ? {} : { details: err.details });
    throw err;
  }
  return { args: JSON.parse(canonical) as JsonObject, canonical, sha256: sha256Hex(canonical) };
}

/**
 * The value a call carries (amount and currency), or null for a tool without one. Throws `invalid_arguments`
 * for a missing or negative amount or a currency other than the caps', `config_invalid` for a tool with value
 * caps but no declared caps currency.
 */
export function valueOf(tool: GateTool, args: JsonObject): Value | null {
  if (tool.value === null) return null;
  const amount = args[tool.value.argument];
  if (typeof amount !== 'number' || !Number.isFinite(amount) || amount < 0) {
    throw refuse('invalid_arguments', `argument ${tool.value.argument} must be a non-negative number`, {
      details: { path: `$.${tool.value.argument}` },
    });
  }
  const currency = tool.value.currency ?? args[tool.value.currencyArgument ?? ''];
  if (typeof currency !== 'string' || currency === '')
    throw refuse('invalid_arguments', `argument ${tool.value.currencyArgument ?? 'currency'} must name a currency`);
  // Caps and the approval threshold are amounts in ONE currency: a value in another one is refused, never
  // counted in a bucket of its own (that doubled every cap for a caller alternating two currencies).
  const limits = tool.value.limitsCurrency;
  if (limits === null && tool.value.valueCapped) {
    throw refuse(
      'config_invalid',
      `${tool.name} has value caps or an approval threshold but no value.limits_currency; its calls are refused until the operator declares one`,
    );
  }
  if (limits !== null && currency !== limits) {
    throw refuse(
      'invalid_arguments',
      `${tool.name} accepts values in ${limits} only: its value caps and approval threshold are in ${limits}`,
      {
        details: { path: `$.${tool.value.currencyArgument ?? tool.value.argument}`, currency: limits },
      },
    );
  }
  return { amount: String(amount), currency };
}

/**
 * The path of the first container nested deeper than `maxDepth` (the root object is depth 1), or null.
 * Iterative, so a hostile 100,000-deep value cannot overflow the stack; stops at the first hit, and never
 * revisits an object (cycles are refused later, by the canonical form).
 */
function depthExceeds(root: unknown, maxDepth: number): string | null {
  const stack: [unknown, number, string][] = [[root, 1, '$']];
  const seen = new Set<object>();
  while (stack.length > 0) {
    const [value, depth, path] = stack.pop() as [unknown, number, string];
    if (value === null || typeof value !== 'object' || seen.has(value)) continue;
    if (depth > maxDepth) return path;
    seen.add(value);
    if (Array.isArray(value)) value.forEach((v, i) => stack.push([v, depth + 1, `${path}[${i}]`]));
    else
      for (const [k, v] of Object.entries(value as Record<string, unknown>)) stack.push([v, depth + 1, `${path}.${k}`]);
  }
  return null;
}

function findIdentityField(value: unknown, path: string): string | null {
  if (value === null || typeof value !== 'object') return null;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const hit = findIdentityField(value[i], `${path}[${i}]`);
      if (hit !== null) return hit;
    }
    return null;
  }
  for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
    if ((IDENTITY_ARGUMENT_NAMES as readonly string[]).includes(k)) return `${path}.${k}`;
    const hit = findIdentityField(v, `${path}.${k}`);
    if (hit !== null) return hit;
  }
  return null;
}
