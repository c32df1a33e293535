/* common/serve/request.h: one parser from API request bodies to a generation
 * request, shared by llm-serve (OpenAI /v1/completions and
 * /v1/chat/completions, Hugging Face TGI /generate) and llm-generate (its
 * JSONL lines and flags).
 *
 * The kind of body picks where fields are and their names and defaults
 * where the APIs differ (TGI's "parameters" object and max_new_tokens,
 * chat's boolean logprobs, JSONL's prompt_ids); the value rules are one,
 * vLLM's where the APIs leave them open: temperature in [0, 100] (the
 * sampler's range), top_p in (0, 1], top_k -1 or 0 for off, an integer
 * seed taken modulo 2^64 (TGI: any number, see get_seed), max_tokens at least 1, at most LLM_MAX_STOP stop strings (more are
 * refused, never cut), a field this code cannot honour refused unless it
 * asks for the default. Every error names its field: the message starts
 * with "FIELD: " and R->param holds FIELD, so a server answers 400 with
 * it and a tool prefixes where the body came from ("stdin: line 3").
 *
 * Structured output (guide.h, grammar.h): at most one of response_format
 * {"type": "json_object"} or {"type": "json_schema", "json_schema":
 * {"schema": {...}}} or TGI's {"type": "json", "value": schema} and
 * {"type": "regex", "value": "..."}, guided_json (a schema, or its JSON text),
 * guided_regex, guided_choice (strings), guided_grammar (grammar text);
 * TGI: parameters.grammar {"type": "json" or "regex", "value": ...}. It is
 * compiled here into p.grammar (the request's reference); a schema keyword
 * or a pattern feature that is not supported is refused naming it. */
#ifndef LLM_REQUEST_H
#define LLM_REQUEST_H

#include "sampler.h"

#define LLM_MAX_N 16             /* choices per request */

struct json_t;
struct llm_tokenizer;
struct llm_gvocab;

enum llm_api_kind {
	LLM_API_COMPLETION,         /* OpenAI /v1/completions */
	LLM_API_CHAT,               /* OpenAI /v1/chat/completions */
	LLM_API_TGI,                /* TGI /generate: {"inputs", "parameters": {...}} */
	LLM_API_JSONL,              /* an llm-generate line: completion or chat fields, prompt_ids */
	LLM_API_RESPONSES,          /* OpenAI /v1/responses (apis.h: translated to chat) */
	LLM_API_MESSAGES,           /* Anthropic /v1/messages (apis.h: translated to chat) */
	LLM_API_MESSAGES_COUNT,     /* Anthropic /v1/messages/count_tokens: the prompt only */
};
#define LLM_API_N_KINDS 7

/* What the parser needs from its caller. */
struct llm_api_env {
	struct llm_sample_params defaults;   /* where a field is absent (stop strings and
	                                      * biases borrowed); TGI: max_tokens 20 */
	struct llm_tokenizer *tk;   /* NULL: only token-id prompts */
	const char *chat_template;  /* template source; NULL: the tokenizer's */
	const char *model_name;     /* "model" must name it (or an adapter); NULL: any string */
	int any_model;              /* 1: a "model" that names no adapter is the base, whatever it
	                             * says (llm-serve without adapters, as TGI and llama.cpp's
	                             * server take any name; llm-serve(1) says why) */
	/* LoRA adapters by slot - 1 (NULL: a free slot): "model" (OpenAI,
	 * JSONL) or "adapter_id" (TGI) naming one sets R->adapter to its slot;
	 * model_name (or, when it is NULL, any other string) the base. */
	const char *const *adapters;
	int n_adapters;
	int adapter;                /* R->adapter when the body names none (0: the base) */
	void *own_lora;             /* llm_jobs_env_lora's names (llm_api_env_guide_free frees them) */
	int n_vocab;                /* token ids below it; 0: not checked here */
	int n_ctx;                  /* prompt + max_tokens within it, max_tokens 0
	                             * becoming the rest; 0: not checked here */
	int max_n;                  /* the most choices (n) a request may ask for */
	struct llm_gvocab *gvocab;  /* the tokens' bytes for grammars, and its cache of them;
	                             * NULL: structured output is refused (no tokenizer) */
	const struct llm_grammar_budget *gbudget;   /* a request's grammar compile's budget (grammar.h);
	                             * NULL: the defaults, no deadline */
};

struct llm_api_req {
	int32_t *prompt;            /* (n_prompt) token ids, malloc'd */
	int n_prompt;
	struct llm_sample_params p; /* stop strings and biases point at stops and bias
	                             * below, or at the env's defaults; p.grammar is a
	                             * reference of R's (the env's default one's, or its own) */
	char *stops[LLM_MAX_STOP];  /* owned */
	struct llm_logit_bias *bias;   /* owned */
	int n;                      /* choices */
	int best_of;                /* completions: choices generated, the n of highest
	                             * cumulative log-prob returned (>= n) */
	int stream, include_usage;  /* OpenAI */
	int logprobs;               /* OpenAI: the chosen tokens' log-probs asked for */
	int details, full_text;     /* TGI: details, return_full_text */
	char *inputs;               /* TGI return_full_text: the input text (owned) */
	int echo;                   /* OpenAI completions: the prompt before each choice's text,
	                             * its tokens in the log-probs (the first null) */
	int prompt_logprobs;        /* vLLM: each prompt token's log-prob, rank and this many best
	                             * (-1: none) */
	int tool_format;            /* chat with tools: enum llm_tool_format of the template, the
	                             * answer parsed into tool calls; 0: not parsed (no tools,
	                             * tool_choice "none") */
	int reasoning;              /* chat: 0 the template has no <think> markers; 1 the answer
	                             * may open a block; 2 the prompt opened it (reasoning.h) */
	char **tool_names;          /* (n_tools) the functions a call may name, owned */
	int n_tools;
	int prefill_details;        /* TGI decoder_input_details: details.prefill */
	int adapter;                /* the LoRA slot named (env->adapters); 0: the base */
	char param[48];             /* on failure: the field at fault ("": none) */
};

/* Parse BODY (a JSON object; NULL: no fields, only ENV's defaults, for a
 * prompt given otherwise: llm_api_req_prompt_text) of KIND into R (zeroed
 * here). On failure R holds nothing to free and the message names the
 * field: LLM_ERR_USAGE for a bad value, LLM_ERR_UNSUPPORTED when "model"
 * or "adapter_id" names neither the model nor one of its adapters (HTTP
 * 404; the message lists what there is), LLM_ERR_NOMEM. Free R with
 * llm_api_req_free. */
enum llm_status llm_api_req_parse(struct llm_api_req *r, enum llm_api_kind kind, struct json_t *body,
                                  const struct llm_api_env *env);
/* R's prompt from TEXT (LEN bytes, tokenized with special tokens such as
 * BOS added when SPECIAL), then the max_tokens and context rules; for a
 * request parsed with BODY NULL. Errors name FIELD. */
enum llm_status llm_api_req_prompt_text(struct llm_api_req *r, const struct llm_api_env *env, const char *field,
                                        const char *text, size_t len, int special);
void llm_api_req_free(struct llm_api_req *r);

/* MSGS (a chat request's "messages") checked, and *OUT (a new reference)
 * the messages as the chat template sees them: a content that is null, or
 * absent from an assistant turn (one that made tool calls), becomes "".
 * Content parts must be text. Errors (LLM_ERR_USAGE, LLM_ERR_NOMEM) start
 * with "messages: " and name the message. */
enum llm_status llm_api_chat_messages(struct json_t *msgs, struct json_t **out);

/* llm-generate's flags: ENV->gvocab from ENV->tk (when it is set), and as
 * the default grammar of every request the schema in file JSON_SCHEMA or
 * the grammar text in file GRAMMAR (NULL: none; not both). Errors name the
 * file. Free with llm_api_env_guide_free. */
enum llm_status llm_api_env_guide(struct llm_api_env *env, const char *json_schema, const char *grammar);
void llm_api_env_guide_free(struct llm_api_env *env);

#endif
