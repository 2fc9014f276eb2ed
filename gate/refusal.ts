/** The refusal a gate decision answers with, thrown inside its transaction so that everything rolls back. */
import type { ErrorCode } from '../core/errors.js';
import type { GateRefusal } from './types.js';

/** A refusal thrown inside the pipeline's transaction: it rolls back, then becomes the structured result. */
export class Refused extends Error {
  constructor(readonly refusal: GateRefusal) {
    super(refusal.message);
  }
}

export function refuse(
  error: ErrorCode,
  message: string,
  extra: Omit<GateRefusal, 'ok' | 'error' | 'message'> = {},
): Refused {
  return new Refused({ ok: false, error, message, ...extra });
}
