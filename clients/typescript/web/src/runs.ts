/**
 * A lane's runs as the event log tells them (no DOM: the node tests check it): each run's
 * turns and tool calls with their times — a call's start (its intent, `tool_start`), when its
 * result was staged (`tool_end`) and when it was placed (its `entry_added`) — and the tokens
 * each turn used (its `usage` rows). The timeline and the usage chart draw these.
 *
 * Times are the commits' (`commit_time`), in milliseconds.
 */
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { OperationKind, OperationResultStatus, type HarnessEvent } from "@lane/client";
import type { LogGroup } from "./history.js";

export interface CallSpan {
  readonly id: string;
  name: string;
  readonly turnId: string;
  /** Its intent was committed (it started running). */
  start: number | undefined;
  /** Its result was staged (it finished). */
  staged: number | undefined;
  /** Its result was placed in the transcript. */
  placed: number | undefined;
  error: boolean;
  /** The call whose result, staged last, let this one's placement happen (when it waited). */
  heldBy: string | undefined;
}

export interface TurnSpan {
  readonly id: string;
  /** 1-based within its run. */
  readonly index: number;
  readonly start: number;
  /** The assistant's message was placed. */
  settled: number | undefined;
  end: number | undefined;
  retries: number;
  input: bigint;
  output: bigint;
  readonly calls: CallSpan[];
}

export interface RunSpan {
  readonly id: string;
  readonly kind: OperationKind;
  readonly start: number;
  /** The revision of its start. */
  readonly startRevision: bigint;
  end: number | undefined;
  status: OperationResultStatus;
  error: string;
  readonly turns: TurnSpan[];
  /** Tokens of the run, its turns' and any recorded outside a turn. */
  input: bigint;
  output: bigint;
}

function ms(event: HarnessEvent): number {
  return event.commitTime === undefined ? 0 : timestampMs(event.commitTime);
}

/** The runs (and compactions, navigations) of `groups`, oldest first. */
export function runsOf(groups: readonly LogGroup[]): RunSpan[] {
  const runs: RunSpan[] = [];
  let run: RunSpan | undefined;
  let turn: TurnSpan | undefined;
  const calls = new Map<string, CallSpan>();
  const open = (id: string, kind: OperationKind, event: HarnessEvent, started: number | undefined): void => {
    run = {
      id,
      kind,
      start: started ?? ms(event),
      startRevision: event.revision,
      end: undefined,
      status: OperationResultStatus.UNSPECIFIED,
      error: "",
      turns: [],
      input: 0n,
      output: 0n,
    };
    runs.push(run);
    turn = undefined;
    calls.clear();
  };
  const close = (id: string, event: HarnessEvent, status: OperationResultStatus, error: string): void => {
    if (run?.id !== id) {
      return;
    }
    run.end = ms(event);
    run.status = status;
    run.error = error;
    run = undefined;
    turn = undefined;
  };
  for (const group of groups) {
    const placedNow: CallSpan[] = [];
    for (const event of group.events) {
      const kind = event.kind;
      switch (kind.case) {
        case "runStart":
          open(kind.value.runId, OperationKind.RUN, event, kind.value.startedTime && timestampMs(kind.value.startedTime));
          break;
        case "compactionStart":
          if (run === undefined) {
            open(kind.value.runId, OperationKind.COMPACTION, event, kind.value.startedTime && timestampMs(kind.value.startedTime));
          }
          break;
        case "navigationStart":
          open(kind.value.runId, OperationKind.NAVIGATION, event, kind.value.startedTime && timestampMs(kind.value.startedTime));
          break;
        case "runEnd":
          close(kind.value.runId, event, kind.value.status, kind.value.error?.message ?? "");
          break;
        case "compactionEnd":
          if (run?.kind === OperationKind.COMPACTION) {
            close(kind.value.runId, event, kind.value.status, kind.value.error?.message ?? "");
          }
          break;
        case "navigationEnd":
          close(kind.value.runId, event, kind.value.status, kind.value.error?.message ?? "");
          break;
        case "turnStart":
          if (run !== undefined && run.id === kind.value.runId) {
            turn = {
              id: kind.value.turnId,
              index: run.turns.length + 1,
              start: ms(event),
              settled: undefined,
              end: undefined,
              retries: 0,
              input: 0n,
              output: 0n,
              calls: [],
            };
            run.turns.push(turn);
          }
          break;
        case "turnEnd":
          if (turn?.id === kind.value.turnId) {
            turn.end = ms(event);
          }
          break;
        case "retryScheduled":
          if (turn !== undefined) {
            turn.retries += 1;
          }
          break;
        case "toolStart": {
          const known = calls.get(kind.value.toolCallId);
          if (known === undefined && turn !== undefined) {
            const call: CallSpan = {
              id: kind.value.toolCallId,
              name: kind.value.toolName,
              turnId: kind.value.turnId,
              start: ms(event),
              staged: undefined,
              placed: undefined,
              error: false,
              heldBy: undefined,
            };
            calls.set(call.id, call);
            turn.calls.push(call);
          } else if (known !== undefined && known.staged === undefined) {
            known.start ??= ms(event); // a replay after a takeover keeps its first start
          }
          break;
        }
        case "toolEnd": {
          const call = calls.get(kind.value.toolCallId);
          if (call !== undefined) {
            call.staged = ms(event);
            call.error = kind.value.isError;
          }
          break;
        }
        case "entryAdded": {
          const message = kind.value.entry?.payload.case === "message" ? kind.value.entry.payload.value.message?.message : undefined;
          if (message?.case === "toolResult") {
            const call = calls.get(message.value.toolCallId);
            if (call !== undefined) {
              call.placed = ms(event);
              call.error = message.value.isError;
              placedNow.push(call);
            }
          } else if (message?.case === "assistant" && turn !== undefined) {
            turn.settled = ms(event);
          }
          break;
        }
        case "usage": {
          const usage = kind.value.row?.usage;
          if (usage !== undefined && run !== undefined) {
            run.input += usage.input;
            run.output += usage.output;
            if (turn !== undefined) {
              turn.input += usage.input;
              turn.output += usage.output;
            }
          }
          break;
        }
        default:
          break;
      }
    }
    // Calls placed together waited for the one among them whose result was staged last.
    const last = placedNow.reduce<CallSpan | undefined>(
      (latest, call) => (latest === undefined || (call.staged ?? 0) > (latest.staged ?? 0) ? call : latest),
      undefined,
    );
    for (const call of placedNow) {
      if (last !== undefined && call !== last && (call.staged ?? 0) < (last.staged ?? 0)) {
        call.heldBy = last.id;
      }
    }
  }
  return runs;
}
