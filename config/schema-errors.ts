/**
 * Ajv's errors (compiled with `allErrors` and `verbose`) as configuration problems a person can act on: enum and
 * const errors list the allowed values and the nearest one, an unknown key names the nearest known key, a
 * missing key is reported at its own path, and of a `oneOf` that failed only the branch the value came closest
 * to is reported. Each error also marks its part malformed, so the later steps skip it.
 */
import type { ErrorObject } from 'ajv';
import { ConfigProblems, nearest, pointer, type ProblemExtra } from '../core/config-problems.js';

type Scalar = string | number | boolean | null;

const isScalar = (v: unknown): v is Scalar =>
  v === null || typeof v === 'string' || typeof v === 'number' || typeof v === 'boolean';

export function reportSchemaErrors(errors: readonly ErrorObject[], problems: ConfigProblems): void {
  for (const e of withoutLosingBranches(errors)) {
    // The pattern error of a property name carries the name; this one only repeats it.
    if (e.keyword === 'propertyNames') continue;
    const { path, message, extra } = described(e);
    problems.add(path, message, extra);
    if (e.keyword !== 'additionalProperties') problems.markMalformed(path);
  }
}

/** One error's path (the key itself for unknown, missing and badly named keys), message and extras. */
function described(e: ErrorObject): { path: string; message: string; extra: ProblemExtra } {
  const p = e.params as Record<string, unknown>;
  const got = isScalar(e.data) ? e.data : undefined;
  const at = (key: unknown): string => `${e.instancePath}${pointer(String(key))}`;
  switch (e.keyword) {
    case 'enum':
    case 'const': {
      const allowed = e.keyword === 'enum' ? (p.allowedValues as unknown[]) : [p.allowedValue];
      const suggestion =
        typeof got === 'string'
          ? nearest(
              got,
              allowed.filter((a) => typeof a === 'string'),
            )
          : undefined;
      const message =
        e.keyword === 'const'
          ? `must be ${JSON.stringify(p.allowedValue)}`
          : `must be one of: ${allowed.map(shown).join(', ')}`;
      return {
        path: e.instancePath,
        message,
        extra: { got, allowed, ...(suggestion === undefined ? {} : { suggestion }) },
      };
    }
    case 'additionalProperties': {
      const key = String(p.additionalProperty);
      const properties = (e.parentSchema as { properties?: Record<string, unknown> } | undefined)?.properties ?? {};
      const allowed = Object.keys(properties);
      const suggestion = nearest(key, allowed);
      const message =
        suggestion !== undefined || allowed.length === 0
          ? 'is not a known key'
          : `is not a known key (known keys: ${allowed.join(', ')})`;
      return { path: at(key), message, extra: { allowed, ...(suggestion === undefined ? {} : { suggestion }) } };
    }
    case 'required':
      return { path: at(p.missingProperty), message: 'is required', extra: {} };
    default:
      if (e.propertyName !== undefined)
        return { path: at(e.propertyName), message: `is not a valid name: it ${e.message ?? 'is invalid'}`, extra: {} };
      return { path: e.instancePath, message: e.message ?? 'is invalid', extra: got === undefined ? {} : { got } };
  }
}

/** A value as an allowed value is shown: strings bare (`deny`), anything else as JSON. */
const shown = (v: unknown): string => (typeof v === 'string' ? v : JSON.stringify(v));

/**
 * The errors with each failed `oneOf` reduced to the branch with the fewest errors (the one the value was
 * meant to match: `{"from": "reciept"}` gets the `from` enum error, not "must have required property value").
 * When no branch has an error of its own (more than one matched), the `oneOf` error itself stays.
 */
function withoutLosingBranches(errors: readonly ErrorObject[]): ErrorObject[] {
  let out = [...errors];
  for (const o of errors.filter((e) => e.keyword === 'oneOf')) {
    const inside = (e: ErrorObject): boolean =>
      e.schemaPath.startsWith(`${o.schemaPath}/`) &&
      (e.instancePath === o.instancePath || e.instancePath.startsWith(`${o.instancePath}/`));
    const byBranch = new Map<string, ErrorObject[]>();
    for (const e of out.filter(inside)) {
      const branch = e.schemaPath.slice(o.schemaPath.length + 1).split('/')[0] ?? '';
      byBranch.set(branch, [...(byBranch.get(branch) ?? []), e]);
    }
    const fewest = [...byBranch.values()].sort((a, b) => a.length - b.length)[0];
    if (fewest === undefined) continue;
    out = out.filter((e) => e === o || !inside(e) || fewest.includes(e)).filter((e) => e !== o);
  }
  return out;
}
