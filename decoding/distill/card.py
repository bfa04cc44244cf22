"""The model card of a distilled draft head, as Markdown, from the card dict stored in its file."""

from __future__ import annotations

from typing import Any


def card_markdown(card: dict[str, Any], title: str) -> str:
    data, training, held, cost = card["data"], card["training"], card["held_out"], card["cost"]
    lines = [
        f"# {title}",
        "",
        f"- target: `{card['target']}`; design: **{card['design']}**, {card['layers']} decoder layer(s), "
        f"{card['parameters'] / 1e6:.2f} M own parameters (embeddings and LM-head rows are the target's)"
        + (f"; reads the target's final hidden state and its residual stream after blocks "
           f"{', '.join(str(i) for i in training['feature_layers'])}, fused by one linear layer"
           if training.get("feature_layers") else "")
        + ("; each position also reads a copy hint (prompt lookup's guess of the next token and its match "
           "length)" if training.get("copy_hint") else "")
        + ("; scores the request's context tokens beside its fixed vocabulary" if training.get("context_vocab")
           else ""),
        f"- vocabulary: the {card['vocabulary']['size']} tokens the target emits most, covering "
        f"{card['vocabulary']['coverage_of_generated_tokens']:.1%} of its generated tokens",
        f"- data: {data['sequences']} sequences ({data['train_sequences']} train, {data['held_out_sequences']} "
        f"held out), the target's own generations on prompts written by the project (categories: "
        f"{', '.join(data['categories'])}); {data['train_generated_tokens']} generated training tokens; "
        + (f"{data['rounds']} rounds of " if data.get("rounds", 1) > 1 else "")
        + f"{data['stage_one']} + {data['stage_two']} prompts"
        + (f" + {data['agent_prompts']} agent-shaped ones (tools in the system prompt, structured copy, "
           "summaries, chat)" if data.get("agent_prompts") else "")
        + f", up to {data['max_new_tokens']} new tokens each, "
        f"{data['sampled_share']:.0%} sampled at T=0.7, "
        + (f"seeds {data['seed']} .. {data['seed'] + data['rounds'] - 1} (one per round)" if data.get("rounds", 1) > 1
           else f"seed {data['seed']}")
        + (f"; plus {data['text_sequences']} standard-library texts (docs and code) read by the target as "
           f"assistant turns (categories doc, code), prompt positions weighted {training.get('prompt_weight', 1)}"
           if data.get("text_sequences") else ""),
        f"- training: {training['updates']} updates of ~{training['tokens_per_update']} tokens "
        f"({training['planned_updates']} planned, {training['epochs']} epochs), {training['steps']} unrolled "
        f"step(s), AdamW lr {training['lr']}, {training['train_wall_s'] / 60:.1f} min on this CPU; "
        f"whole run {card['total_wall_s'] / 60:.1f} min"
        + (f" (the last process's: it resumed at update {training['resumed_at_update']}; the training time counts "
           "every process)" if training.get("resumed_at_update") is not None else ""),
        f"- cost: one draft step {cost['draft_step_ms']} ms vs one target step {cost['target_step_ms']} ms "
        f"(**{cost['relative_cost']:.1%}**)",
        "",
        f"Held-out greedy chains (up to {held['depth']} drafts; acceptance length = 1 + accepted drafts):",
        "",
        "| category | chains | first draft accepted | mean accepted | mean acceptance length |",
        "|---|---:|---:|---:|---:|",
    ]
    rows = [*held["categories"].items(), ("**all**", held["all"])]
    for name, s in rows:
        lines.append(f"| {name} | {s['chains']} | {s['first_draft_accepted']:.1%} | {s['mean_accepted']:.2f} "
                     f"| {s['mean_acceptance_length']:.2f} |")
    return "\n".join(lines) + "\n"
