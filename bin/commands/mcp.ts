/**
 * `mcp --stdio`: the gate as a Model Context Protocol server on stdin and stdout, for an agent host that starts
 * its tools as local processes. It acts with the API token in `ACTIONLEDGER_TOKEN` (there is no break-glass
 * here: an agent is never the operator), authenticated again on every request, so an expired or revoked token
 * or a revoked role stops the next call, and counted in the token's request window, which the server holds it
 * to (`rate_limited` beyond the limit, as over HTTP). Like the rest of the command line it runs no business validators or
 * resource resolvers: a tool that needs one is refused `config_invalid` (use the service's `/mcp` for those).
 * stdout carries only the protocol; logs go to stderr. It runs until it is signalled, or until stdin closes and
 * the requests it had read are answered.
 */
import { ActionLedgerError } from '../../core/errors.js';
import { EXIT, parseCommand, printRefusal, stderrLog, usageError, type Command } from '../cli-util.js';
import { TOKEN_ENV } from './acting.js';
import { load } from './load.js';

export const mcpCommand: Command = {
  name: 'mcp',
  summary: 'serve the gate to a local agent host over the Model Context Protocol (stdio)',
  notes: `Acts with ${TOKEN_ENV} (a service token that may act for users, or an agent's own), checked on every
request. The host sets the trusted context in each request's _meta (actionledger/task_id, workflow_step_id,
turn_id, user, ...): see docs/mcp.md. The service itself serves the same tools over Streamable HTTP at /mcp.`,
  options: {
    stdio: {
      type: 'boolean',
      description: 'speak MCP on stdin/stdout (the one transport of this command)',
      default: 'required',
    },
  },
  examples: ['actionledger mcp --stdio'],
  exits: [EXIT.ok, EXIT.refused, EXIT.usage],
  async run(argv) {
    const parsed = parseCommand(mcpCommand, argv);
    if (typeof parsed === 'number') return parsed;
    if (parsed.values.stdio !== true) return usageError(mcpCommand, '--stdio is required');
    const token = process.env[TOKEN_ENV];
    if (token === undefined || token === '')
      return printRefusal(
        new ActionLedgerError('unauthenticated', `set ${TOKEN_ENV} to the API token the agent host acts with`, {
          details: { reason: 'missing' },
        }),
      );
    try {
      return await serve(token);
    } catch (err) {
      return printRefusal(err);
    }
  },
};

async function serve(token: string): Promise<number> {
  const [{ openRuntime }, { EffectKeyer, Ledger }, { AuditWriter, Gate }, { PrincipalStore }, { loadMcpServer }] =
    await Promise.all([load.runtime(), load.ledger(), load.gate(), load.principals(), load.server()]);
  const createMcpServer = await loadMcpServer();
  const { StdioServerTransport } = await import('@modelcontextprotocol/sdk/server/stdio.js');
  const rt = await openRuntime({ name: 'mcp', migrate: true, defaultMetrics: false, logDestination: stderrLog() });
  const ledger = new Ledger(rt.config, rt.pool, new EffectKeyer(rt.effectKeys));
  try {
    const audit = new AuditWriter({ config: rt.config, pool: rt.pool, log: rt.log });
    const store = new PrincipalStore(rt.config, rt.pool, audit);
    // Refused at once (exit 1, one JSON line) rather than after the host's first request.
    await store.authenticate(token);
    const gate = new Gate({
      config: rt.config,
      pool: rt.pool,
      ledger,
      withoutValidators: true,
      withoutResolvers: true,
      log: rt.log,
    });
    const server = createMcpServer({
      config: rt.config,
      pool: rt.pool,
      gate,
      audit,
      log: rt.log,
      caller: () => store.authenticate(token),
    });
    const closed = new Promise<void>((resolve) => {
      server.onclose = resolve;
    });
    const stop = () => void server.close();
    const transport = new StdioServerTransport();
    await server.connect(transport);
    // A host that writes its requests and closes stdin (a pipe) still gets every answer: the end of stdin stops
    // the server once the requests already read are answered, or after END_OF_INPUT_GRACE_MS.
    const afterEnd = answerBeforeClosing(transport, stop);
    process.stdin.once('end', afterEnd);
    process.once('SIGTERM', stop);
    process.once('SIGINT', stop);
    await closed;
    process.stdin.off('end', afterEnd);
    process.off('SIGTERM', stop);
    process.off('SIGINT', stop);
    return EXIT.ok;
  } finally {
    ledger.stop();
    await rt.close();
  }
}

/** How long requests read before stdin closed may still take to be answered (a call waiting on the user never is). */
const END_OF_INPUT_GRACE_MS = 30_000;

type Transport = InstanceType<typeof import('@modelcontextprotocol/sdk/server/stdio.js').StdioServerTransport>;

/**
 * Tracks the requests the transport has read and not yet answered, and returns what to do when stdin ends:
 * stop at once when none is open, otherwise when the last is answered (or after the grace period).
 */
function answerBeforeClosing(transport: Transport, stop: () => void): () => void {
  const open = new Set<string | number>();
  let ended = false;
  const received = transport.onmessage;
  transport.onmessage = (message) => {
    if ('method' in message && 'id' in message) open.add(message.id);
    received?.(message);
  };
  const send = transport.send.bind(transport);
  transport.send = async (message) => {
    await send(message);
    if (!('method' in message) && 'id' in message && message.id !== undefined) {
      open.delete(message.id);
      if (ended && open.size === 0) stop();
    }
  };
  return () => {
    ended = true;
    if (open.size === 0) stop();
    else setTimeout(stop, END_OF_INPUT_GRACE_MS).unref();
  };
}
