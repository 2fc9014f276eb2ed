/**
 * The console's forms: bodies posted as application/x-www-form-urlencoded, read strictly (each field once, text
 * only), and the CSRF check every POST passes before its fields are used.
 */
import type { FastifyRequest } from 'fastify';
import { ActionLedgerError } from '../../core/errors.js';
import { checkCsrf } from './session.js';

export type Form = Record<string, string>;

/**
 * A form body (`application/x-www-form-urlencoded`): each field once, text only, decoded strictly. Fields are
 * split on `&`, a name from its value on the first `=`, `+` is a space, and each part is percent-decoded as
 * UTF-8: an escape whose bytes are not UTF-8 (`%FF%FE`) or a malformed one (`%G0`) is refused, never replaced
 * with U+FFFD as URLSearchParams would, the same refusal as a body whose raw bytes are not UTF-8. Throws
 * `invalid_request`.
 */
export function parseForm(body: string): Form {
  const out: Form = {};
  for (const pair of body.split('&')) {
    if (pair === '') continue;
    const eq = pair.indexOf('=');
    const k = formDecode(eq === -1 ? pair : pair.slice(0, eq));
    const v = formDecode(eq === -1 ? '' : pair.slice(eq + 1));
    if (Object.hasOwn(out, k))
      throw new ActionLedgerError('invalid_request', `the field ${k} was sent twice`, { details: { field: k } });
    out[k] = v;
  }
  return out;
}

/** One name or value of a form, `+` as a space and percent-escapes decoded as UTF-8; throws `invalid_request`. */
function formDecode(part: string): string {
  if (/%(?![0-9A-Fa-f]{2})/.test(part))
    throw new ActionLedgerError('invalid_request', 'the form holds a malformed percent-escape', {
      details: { problem: 'malformed_escape' },
    });
  try {
    return decodeURIComponent(part.replaceAll('+', ' '));
  } catch {
    throw new ActionLedgerError(
      'invalid_request',
      'the body is not valid UTF-8 (a percent-escape of bytes that are not)',
      {
        details: { problem: 'not_utf8' },
      },
    );
  }
}

/** The form of a POST, with its CSRF token checked first. */
export function form(request: FastifyRequest): Form {
  const type = (request.headers['content-type'] ?? '').split(';')[0]?.trim().toLowerCase();
  if (type !== 'application/x-www-form-urlencoded')
    throw new ActionLedgerError('unsupported_media_type', 'the console takes HTML forms only');
  const body = (request.body ?? {}) as Form;
  checkCsrf(request, body.csrf);
  return body;
}
