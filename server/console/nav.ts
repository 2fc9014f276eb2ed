/**
 * Which console pages a signed-in person may open, from the roles they hold in their tenants: the menu shows
 * only those (a page the person's roles refuse would only answer 403), and `/console/` leads to the first.
 * The pages check again on every request; this only decides what is offered.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { holds } from '../api/auth.js';
import type { ApiDeps, Caller } from '../api/types.js';
import { callerIn, tenantsOf } from './session.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** The console pages the signed-in person may open, in menu order (set before the handler runs). */
    consolePages?: readonly ConsolePage[];
  }
}

export const CONSOLE_PAGES = ['overview', 'approvals', 'operations', 'review', 'kill-switches', 'audit'] as const;
export type ConsolePage = (typeof CONSOLE_PAGES)[number];

/** Whether one tenant's roles open the page (as the page itself decides). */
function opens(deps: ApiDeps, c: Caller, p: ConsolePage): boolean {
  switch (p) {
    case 'overview':
    case 'operations':
      return holds(deps, c, 'read');
    case 'approvals':
      return (
        holds(deps, c, 'read') ||
        [...deps.config.gate.tools.values()].some((t) => c.roles.some((r) => t.approverRoles.has(r)))
      );
    case 'review':
      return holds(deps, c, 'read') || holds(deps, c, 'review');
    case 'kill-switches':
      return holds(deps, c, 'kill_switch');
    case 'audit':
      return holds(deps, c, 'audit');
  }
}

export function pagesFor(deps: ApiDeps, request: FastifyRequest): ConsolePage[] {
  const callers = tenantsOf(request).map((t) => callerIn(request, t));
  return CONSOLE_PAGES.filter((p) => callers.some((c) => opens(deps, c, p)));
}

/** The `preHandler` hook that sets `request.consolePages` for a signed-in request. */
export function navHook(deps: ApiDeps) {
  return (request: FastifyRequest, _reply: FastifyReply, done: () => void): void => {
    if (request.signedIn !== undefined) request.consolePages = pagesFor(deps, request);
    done();
  };
}
