/**
 * The routes' request types are derived from the JSON Schemas they validate with (server/api/types.ts
 * `SchemaTypes`, json-schema-to-ts), not written beside them. These assertions are checked by the compiler
 * (`npm run typecheck` fails when one is false) and pin what the derivation gives for a few routes: required
 * fields present, optional ones optional, defaulted query fields present, enumerations as unions, a union of
 * schemas as the union of their types. The runtime part shows ajv, compiled as the API compiles query strings,
 * fills in every defaulted field the type says is present.
 */
import t from 'tap';
import { Ajv } from 'ajv';
import type { OperationStatus } from '../../core/types.js';
import type { FromRouteSchema, SchemaTypes } from '../../server/api/types.js';
import { approvalListQuery, approveBody } from '../../server/api/routes/approvals.js';
import { callBody } from '../../server/api/routes/calls.js';
import { operationListQuery, reserveBody } from '../../server/api/routes/operations.js';
import { retryBody } from '../../server/api/routes/review.js';

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
type Assert<T extends true> = T;

/** What a route registered on the typed app reads as its body or query: the provider applied as fastify applies it. */
type Derived<S> = (SchemaTypes & { schema: S })['validator'];

type ApproveBody = Derived<typeof approveBody>;
type ApprovalListQuery = Derived<typeof approvalListQuery>;
type CallBody = Derived<typeof callBody>;
type ReserveBody = Derived<typeof reserveBody>;
type OperationListQuery = Derived<typeof operationListQuery>;
type RetryBody = Derived<typeof retryBody>;

export type Checks = [
  Assert<Equal<ApproveBody, { envelope_sha256: string; role?: string; acknowledge_hidden_characters?: boolean }>>,
  // Query fields with a default are always there (ajv fills them in before the handler runs); enum plus 'all'.
  Assert<
    Equal<
      ApprovalListQuery,
      {
        status: 'pending' | 'approved' | 'executed' | 'rejected' | 'expired' | 'invalidated' | 'all';
        tool?: string;
        limit: number;
        cursor?: string;
      }
    >
  >,
  Assert<
    Equal<
      OperationListQuery,
      {
        status?: OperationStatus;
        tool?: string;
        task_id?: string;
        principal_id?: string;
        limit: number;
        cursor?: string;
      }
    >
  >,
  // A schema without a type (the model's arguments) is unknown; the identity fields are spread in from auth.ts.
  Assert<Equal<CallBody['arguments'], unknown>>,
  Assert<Equal<CallBody['task_id'], string>>,
  Assert<Equal<CallBody['ttl_s'], number | undefined>>,
  Assert<
    Equal<
      CallBody['user'],
      { principal_id: string; role: string; account_id: string; conversation_id: string; turn_id: string } | undefined
    >
  >,
  Assert<
    Equal<
      ReserveBody,
      {
        tool: string;
        arguments: { [x: string]: unknown };
        task_id: string;
        workflow_step_id: string;
        approval_id: string;
        policy_version: string;
        user?: { principal_id: string };
      }
    >
  >,
  Assert<Equal<RetryBody, { reason: string; expect?: { attempt: number; review_reason: string } }>>,
  // The review actions register one of three body schemas: the handler reads the union of their types.
  Assert<Equal<FromRouteSchema<typeof retryBody | typeof approveBody>, RetryBody | ApproveBody>>,
];

// The derived type is not `any`: a field the schema does not declare is a compile error.
// @ts-expect-error -- `note` is not a property of the approve body's schema (additionalProperties: false)
export const undeclared: ApproveBody = { envelope_sha256: 'a'.repeat(64), note: 'x' };

t.test('ajv (as the API compiles query strings) fills in every field the derived type says is present', (t) => {
  const coercing = new Ajv({ strict: true, coerceTypes: true, useDefaults: true, removeAdditional: false });
  coercing.addKeyword({ keyword: 'example' });
  const approvals: unknown = {};
  t.ok(coercing.compile(approvalListQuery)(approvals), 'an empty query is valid');
  const a = approvals as ApprovalListQuery;
  t.equal(a.status, 'pending');
  t.equal(a.limit, 50);
  const operations: unknown = { limit: '7' };
  t.ok(coercing.compile(operationListQuery)(operations));
  t.equal((operations as OperationListQuery).limit, 7, 'coerced to the declared integer');
  t.end();
});
