/**
 * Slack's interactivity endpoint: where an approval message's Approve / Reject buttons post. Not a bearer
 * route: Slack authenticates by signing the request (checked by the notifier before anything else is read),
 * so this plugin takes the raw form body instead of JSON. The notifier maps the Slack user to a principal and
 * asks the gate, exactly as the approval routes do.
 */
import type { FastifyInstance } from 'fastify';
import type { ApiDeps, SchemaTypes } from '../types.js';

const header = (v: string | string[] | undefined): string | undefined => (typeof v === 'string' ? v : undefined);

export function registerSlackRoutes(app: FastifyInstance, deps: ApiDeps): void {
  void app.register((untyped, _opts, done) => {
    const child = untyped.withTypeProvider<SchemaTypes>();
    child.removeAllContentTypeParsers();
    child.addContentTypeParser('application/x-www-form-urlencoded', { parseAs: 'buffer' }, (_request, body, next) =>
      next(null, body),
    );
    // The body is the raw form (a Buffer, for the signature), not JSON: it has no schema.
    child.post(
      '/integrations/slack/:destination/interactions',
      {
        config: {
          public: true,
          operationId: 'slackInteraction',
          errors: ['unauthenticated', 'not_found', 'invalid_request', 'body_too_large', 'unsupported_media_type'],
        },
        schema: {
          summary: "Slack's interactivity requests (signed by Slack; application/x-www-form-urlencoded)",
          tags: ['notifications'],
          params: {
            type: 'object',
            required: ['destination'],
            additionalProperties: false,
            properties: { destination: { type: 'string', minLength: 1, maxLength: 63 } },
          },
        },
      },
      async (request, reply) => {
        if (deps.slack === undefined)
          return reply.code(404).send({ ok: false, error: 'not_found', message: 'no Slack destination is configured' });
        const answer = await deps.slack.handle(
          request.params.destination,
          {
            signature: header(request.headers['x-slack-signature']),
            timestamp: header(request.headers['x-slack-request-timestamp']),
          },
          Buffer.isBuffer(request.body) ? request.body : Buffer.alloc(0),
        );
        return reply.code(answer.status).send(answer.body);
      },
    );
    done();
  });
}
