import { pino, type Logger } from 'pino';

export type { Logger };

/**
 * Structured JSON logs. Arguments, credentials and authenticated bodies are redacted by path, so a log line
 * can name an operation, tool, tenant and outcome without carrying what was sent.
 */
export function createLogger(options: { level: string; name: string; destination?: pino.DestinationStream }): Logger {
  return pino(
    {
      name: options.name,
      level: options.level,
      base: { pid: process.pid },
      redact: {
        paths: [
          'arguments',
          '*.arguments',
          'arguments_json',
          '*.arguments_json',
          'args',
          '*.args',
          'secret',
          '*.secret',
          'credential',
          '*.credential',
          'authorization',
          'headers.authorization',
          '*.headers.authorization',
          'body',
          '*.body',
          'password',
          '*.password',
        ],
        censor: '[redacted]',
      },
    },
    options.destination,
  );
}
