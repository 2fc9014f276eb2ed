/**
 * fastify's own errors as the project's codes: one mapping for the API's error handler (server/api/app.ts) and
 * the console's error page (server/console/plugin.ts), so a body over the cap, a media type nobody parses, a
 * JSON body that is not JSON, a request that fails its schema or any other malformed request answers the same
 * code wherever it arrives. Only the wording differs: the API speaks of a JSON body, the console of a form.
 */
import type { FastifyError } from 'fastify';
import { ActionLedgerError, asActionLedgerError, type ErrorCode } from '../../core/errors.js';

/** What the surface takes as a body, for the messages: its noun and its one media type. */
export interface BodyKind {
  noun: 'body' | 'form';
  mediaType: string;
}

export const JSON_BODY: BodyKind = { noun: 'body', mediaType: 'application/json' };
export const FORM_BODY: BodyKind = { noun: 'form', mediaType: 'application/x-www-form-urlencoded' };

type Mapped = (body: BodyKind) => [ErrorCode, string];

const tooLarge: Mapped = (b) => ['body_too_large', `the ${b.noun} is over the cap`];
const notParsed: Mapped = (b) => ['unsupported_media_type', `send the ${b.noun} as ${b.mediaType}`];

/** fastify's error codes with a meaning of their own, each as a code and a message. */
const KNOWN: Record<string, Mapped> = {
  FST_ERR_CTP_BODY_TOO_LARGE: tooLarge,
  FST_ERR_CTP_INVALID_MEDIA_TYPE: notParsed,
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: () => ['invalid_request', 'the content-length does not match the body'],
  FST_ERR_CTP_EMPTY_JSON_BODY: () => ['invalid_json', 'the body is empty'],
  FST_ERR_CTP_INVALID_JSON_BODY: () => ['invalid_json', 'the body is not JSON'],
  FST_ERR_BAD_URL: () => ['invalid_request', 'the request path is malformed'],
  FST_ERR_ASYNC_CONSTRAINT: () => ['invalid_request', 'the request path is malformed'],
};

/**
 * The coded form of an error fastify (or a hook, parser or handler) raised: an ActionLedgerError as it is; a
 * schema violation `invalid_request` naming the field (`details.field`, `details.problem` the failed keyword);
 * fastify's known codes as above; any other client error by its status (413 `body_too_large`, 415
 * `unsupported_media_type`, other 4xx `invalid_request`); anything else as `asActionLedgerError` codes it (a
 * database failure by its SQLSTATE, the rest `internal`).
 */
export function frameworkError(err: FastifyError | Error, body: BodyKind = JSON_BODY): ActionLedgerError {
  if (err instanceof ActionLedgerError) return err;
  const e = err as Partial<FastifyError>;
  if (e.validation !== undefined) {
    const first = e.validation[0];
    const where = e.validationContext ?? 'body';
    const field = first === undefined ? where : fieldOf(where, first.instancePath, first.params);
    return new ActionLedgerError('invalid_request', `${field} ${first?.message ?? 'is invalid'}`, {
      details: { field, problem: first?.keyword ?? 'invalid' },
    });
  }
  const status = e.statusCode;
  const mapped =
    (e.code === undefined ? undefined : KNOWN[e.code]) ??
    (status === 413 ? tooLarge : status === 415 ? notParsed : undefined);
  if (mapped !== undefined) return new ActionLedgerError(...mapped(body));
  if (status !== undefined && status >= 400 && status < 500)
    return new ActionLedgerError('invalid_request', 'the request is malformed');
  return asActionLedgerError(err);
}

/** `body.items.0.name` from where the schema failed (ajv's instance path and the property it names). */
function fieldOf(where: string, instancePath: string, params: Record<string, unknown>): string {
  const extra =
    typeof params.additionalProperty === 'string'
      ? `/${params.additionalProperty}`
      : typeof params.missingProperty === 'string'
        ? `/${params.missingProperty}`
        : '';
  return `${where}${instancePath}${extra}`.replaceAll('/', '.');
}
