/** Runs the real `actionledger` command as a child process. */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { nodeCommand } from './node-child.js';

export const BIN = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'bin', 'actionledger.js');

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

export function runCli(
  args: string[],
  env: NodeJS.ProcessEnv,
  options: { timeoutMs?: number; input?: string } = {},
): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(...nodeCommand([BIN, ...args]), {
      env: { PATH: process.env.PATH, ...env },
      stdio: [options.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
    });
    if (options.input !== undefined) child.stdin?.end(options.input);
    let stdout = '';
    let stderr = '';
    child.stdout?.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr?.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 60_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** The last JSON line a command printed on stdout. */
export function lastJson(out: string): Record<string, unknown> {
  const lines = out
    .trim()
    .split('\n')
    .filter((l) => l.startsWith('{'));
  return JSON.parse(lines[lines.length - 1] ?? 'null') as Record<string, unknown>;
}

/** `actionledger reserve` for `issue_refund` in tenant-a, one workflow step of task-1 (override any field). */
export function reserveArgs(
  step: string,
  args = '{"order_id":"o-1","amount":10,"currency":"EUR"}',
  over: { principal?: string; task?: string } = {},
): string[] {
  return [
    'reserve',
    ...['--tenant', 'tenant-a', '--principal', over.principal ?? 'p-1', '--task', over.task ?? 'task-1'],
    ...['--step', step, '--approval', 'ap-1', '--policy', 'v1', '--tool', 'issue_refund', '--args', args],
  ];
}
