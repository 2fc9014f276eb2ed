/**
 * A proposal's confirmation over MCP: the built-in confirm (a token in a later turn) and the question asked
 * through the client (elicitation). What the user is asked shows what will be done as every surface a person
 * decides on shows it (core/visible-text.ts): each hidden character as its code, the arguments as JSON with
 * those written as escapes. When what is confirmed holds hidden characters or text written right to left, the
 * question says so and the form carries a second yes, {@link ACCEPT_HIDDEN_FIELD}: without it the confirmation
 * is refused `hidden_characters` and the proposal cancelled, as an approval would be refused without its
 * acknowledgement.
 */
import { randomUUID } from 'node:crypto';
import { ElicitResultSchema } from '@modelcontextprotocol/sdk/types.js';
import type { JsonObject } from '../../core/json.js';
import { foundInWords, hiddenInJson, revealHidden, visibleJson, type HiddenFound } from '../../core/visible-text.js';
import type { GateContext, GateResult } from '../../gate/index.js';
import { describeEffect } from '../../gate/index.js';
import type { Extra, McpDeps } from './server.js';

/**
 * Confirms with the token in `context`'s turn, then executes: with `shown` (the arguments the user confirmed)
 * the gate compares them with the proposed ones by hash, and a difference is `params_mismatch`: the proposal
 * is then cancelled, nothing reserved.
 */
export async function confirmAndExecute(
  deps: McpDeps,
  token: string,
  context: GateContext,
  shown: JsonObject | undefined,
): Promise<GateResult> {
  const confirmed = await deps.gate.confirm(token, context);
  if (!confirmed.ok || confirmed.request_id === undefined) return confirmed;
  const executed = await deps.gate.executeProposal(
    confirmed.request_id,
    context,
    shown === undefined ? {} : { args: shown },
  );
  if (!executed.ok && executed.error === 'params_mismatch')
    await deps.gate.cancelProposal(confirmed.request_id, context);
  return executed;
}

/** The form field that carries the user's yes. */
export const CONFIRM_FIELD = 'confirm';
/**
 * The form field that carries the user's second yes, present when what is confirmed holds hidden characters or
 * text written right to left: the user read them as shown and confirms exactly that.
 */
export const ACCEPT_HIDDEN_FIELD = 'accept_hidden_characters';
/** The prefix of every argument's form field when an argument is itself named like one of the fields above. */
export const ARGUMENT_FIELD_PREFIX = 'argument:';

/**
 * How arguments are named in the form, and back: by their own names, or, when one argument is named like the
 * confirmation field or the acknowledgement field, each under {@link ARGUMENT_FIELD_PREFIX} (a namespace those
 * are not in), so the user's yes and an argument's value never share a field. A field of the answer that is
 * not an argument's field is taken as an argument of its own name: an added argument, refused params_mismatch
 * like any change.
 */
function formFields(args: Record<string, unknown>): {
  field: (name: string) => string;
  argument: (field: string) => string;
} {
  if (!Object.hasOwn(args, CONFIRM_FIELD) && !Object.hasOwn(args, ACCEPT_HIDDEN_FIELD))
    return { field: (name) => name, argument: (field) => field };
  return {
    field: (name) => ARGUMENT_FIELD_PREFIX + name,
    argument: (field) => (field.startsWith(ARGUMENT_FIELD_PREFIX) ? field.slice(ARGUMENT_FIELD_PREFIX.length) : field),
  };
}

type Primitive = string | number | boolean;
const isPrimitive = (v: unknown): v is Primitive =>
  typeof v === 'string' || typeof v === 'number' || typeof v === 'boolean';

/** A value as the form presets it: a string with each hidden character as its code, anything else as it is. */
const preset = (v: Primitive): Primitive => (typeof v === 'string' ? revealHidden(v) : v);

/**
 * The question: the effect and the exact arguments as a person must read them, a warning naming what is
 * hidden or right to left, and the form (the yes, the second yes when needed, each argument preset as shown).
 */
function question(
  name: string,
  effect: string,
  args: Record<string, unknown>,
  hidden: readonly HiddenFound[],
  form: ReturnType<typeof formFields>,
): { message: string; properties: Record<string, Record<string, unknown>> } {
  const properties: Record<string, Record<string, unknown>> = {
    [CONFIRM_FIELD]: { type: 'boolean', title: 'Carry this out', description: 'yes: do exactly this, once' },
  };
  if (hidden.length > 0)
    properties[ACCEPT_HIDDEN_FIELD] = {
      type: 'boolean',
      title: 'I read the hidden characters by their codes',
      description: 'yes: what is shown by its codes, and any text written right to left, is exactly what I confirm',
    };
  if (Object.values(args).every(isPrimitive))
    for (const [k, v] of Object.entries(args))
      properties[form.field(k)] = {
        type: typeof v === 'boolean' ? 'boolean' : typeof v,
        title: revealHidden(k),
        default: preset(v as Primitive),
      };
  const lines = [`Confirm ${revealHidden(name)}: ${revealHidden(effect)}`, `Exact arguments: ${visibleJson(args)}`];
  if (hidden.length > 0)
    lines.push(
      `Warning (hidden_characters): this holds characters a screen would not draw as stored, or text written right to left, which reorders the digits and words around it (${foundInWords(hidden, 5)}). Each hidden character is shown here as its code. To carry it out, also answer ${ACCEPT_HIDDEN_FIELD}: yes.`,
    );
  return { message: lines.join('\n'), properties };
}

/**
 * Asks the user, through the client, to confirm the exact arguments (each top-level argument a field preset to
 * the proposed value as shown, when they are all plain values). The answer is the user's own turn: accepted, it
 * goes through Gate.confirm in a turn id of its own (never the call's) and Gate.executeProposal with the
 * arguments as the user left them (a field left as preset is the proposed value), in the context `recheck`
 * rebuilds once the answer is in; declined or cancelled, the proposal is cancelled (`confirmation_declined`);
 * accepted without the second yes that hidden characters need, cancelled too (`hidden_characters`).
 */
export async function elicitConfirmation(
  deps: McpDeps,
  context: GateContext,
  recheck: () => Promise<GateContext>,
  name: string,
  args: Record<string, unknown>,
  proposal: GateResult & { ok: false },
  extra: Extra,
): Promise<GateResult> {
  const tool = deps.gate.tool(name);
  const token = proposal.confirm_token;
  const id = proposal.request_id;
  if (tool === undefined || token === undefined || id === undefined) return proposal;
  const effect = describeEffect(tool, args as JsonObject);
  const hidden = hiddenInJson({ tool: name, effect, arguments: args });
  const form = formFields(args);
  const { message, properties } = question(name, effect, args, hidden, form);
  let answer;
  try {
    answer = await extra.sendRequest(
      {
        method: 'elicitation/create',
        params: {
          message,
          requestedSchema: { type: 'object', properties, required: Object.keys(properties) } as never,
        },
      },
      ElicitResultSchema,
    );
  } catch (err) {
    // The client could not ask: the proposal stays, for the next-turn confirmation.
    deps.log.warn({ err, proposal: id }, 'MCP elicitation failed; the next-turn confirmation applies');
    return proposal;
  }
  const content = answer.content ?? {};
  const elicited: GateContext = { ...context, turn_id: `elicitation:${randomUUID()}` };
  const refusal = refusedAnswer(name, id, hidden, answer.action, content);
  if (refusal !== null) {
    await deps.gate.cancelProposal(id, elicited);
    return refusal;
  }
  const shown: JsonObject = { ...(args as JsonObject) };
  for (const [k, v] of Object.entries(content)) {
    if (k === CONFIRM_FIELD || k === ACCEPT_HIDDEN_FIELD) continue;
    const arg = form.argument(k);
    const proposed = args[arg];
    // A string left as it was preset (its hidden characters as codes) is the proposed value.
    shown[arg] = isPrimitive(proposed) && v === preset(proposed) ? proposed : v;
  }
  // Throws (a tool error; the proposal stays unconfirmed until it expires) when the caller lost its standing.
  const now = await recheck();
  return confirmAndExecute(deps, token, { ...now, turn_id: elicited.turn_id }, shown);
}

/** Why the user's answer confirms nothing (declined, or without the second yes hidden characters need), or null. */
function refusedAnswer(
  name: string,
  id: string,
  hidden: readonly HiddenFound[],
  action: string,
  content: Record<string, unknown>,
): GateResult | null {
  if (action !== 'accept' || content[CONFIRM_FIELD] !== true)
    return {
      ok: false,
      error: 'confirmation_declined',
      message: `the user did not confirm ${name}; nothing was done`,
      request_id: id,
    };
  if (hidden.length > 0 && content[ACCEPT_HIDDEN_FIELD] !== true)
    return {
      ok: false,
      error: 'hidden_characters',
      message: `the user confirmed ${name} without ${ACCEPT_HIDDEN_FIELD}, and it holds what a reader would not see as stored (${foundInWords(hidden, 3)}); nothing was done`,
      request_id: id,
      details: { hidden },
    };
  return null;
}
