/** The words the console uses for the contract's enums, in one place. */
import { LaneStatus, OperationKind, OperationResultStatus, QueueKind } from "@lane/client";

/** Lane statuses as the list names them (and as its `status` filter spells them). */
export const STATUS_NAMES: Readonly<Record<number, string>> = {
  [LaneStatus.IDLE]: "idle",
  [LaneStatus.RUNNING]: "running",
  [LaneStatus.ABORTING]: "aborting",
  [LaneStatus.SUSPENDED]: "suspended",
  [LaneStatus.RETRY_WAITING]: "retry waiting",
  [LaneStatus.COMPACTING]: "compacting",
  [LaneStatus.FAULTED]: "faulted",
};

export const KIND_NAMES: Readonly<Record<number, string>> = {
  [OperationKind.RUN]: "run",
  [OperationKind.COMPACTION]: "compaction",
  [OperationKind.NAVIGATION]: "navigation",
};

export const RESULT_NAMES: Readonly<Record<number, string>> = {
  [OperationResultStatus.COMPLETED]: "completed",
  [OperationResultStatus.DECLINED]: "declined",
  [OperationResultStatus.ABORTED]: "aborted",
  [OperationResultStatus.FAILED]: "failed",
};

export const QUEUE_NAMES: Readonly<Record<number, string>> = {
  [QueueKind.STEER]: "steer",
  [QueueKind.FOLLOW_UP]: "follow-up",
  [QueueKind.NEXT_RUN]: "next run",
  [QueueKind.WRITE]: "entry",
};

/** A result that went wrong (drawn in red). */
export function badResult(status: OperationResultStatus): boolean {
  return status === OperationResultStatus.FAILED || status === OperationResultStatus.ABORTED;
}
