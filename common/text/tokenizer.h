/* common/text/tokenizer.h: Hugging Face tokenizers (tokenizer.json), exactly.
 *
 * Reads tokenizer.json + tokenizer_config.json (+ special_tokens_map.json,
 * generation_config.json) and encodes/decodes as the Hugging Face
 * `tokenizers` library does for the BPE families Llama-family models use:
 *   - SentencePiece-style BPE with byte fallback (Llama 2, Mistral,
 *     TinyLlama, stories260K): normalizer Prepend/Replace, decoder
 *     Replace/ByteFallback/Fuse/Strip;
 *   - byte-level BPE with a regex pre-tokenizer (Llama 3, Qwen, SmolLM):
 *     Split(Regex) + ByteLevel, NFC, ByteLevel decoder.
 * Added and special tokens are split out of the text first (leftmost-longest,
 * with their lstrip/rstrip flags); each remaining segment is normalized,
 * pre-tokenized and run through BPE (priority queue over a linked list of
 * symbols, O(n log n) per word). BOS/EOS come from the post-processor
 * (TemplateProcessing) as the file says; for tokenizer_class LlamaTokenizer
 * (Fast) add_bos_token/add_eos_token in tokenizer_config.json override it,
 * as transformers does. Decoding applies the decoder chain, then
 * clean_up_tokenization_spaces when the config sets it.
 *
 * Any component type this file does not implement is an LLM_ERR_UNSUPPORTED
 * error at open time, never a silently different tokenization.
 * Reference: huggingface/tokenizers (Rust), transformers tokenization_utils. */
#ifndef LLM_TOKENIZER_H
#define LLM_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "status.h"
#include "detok.h"

struct llm_tokenizer;

/* Side-file lookup for llm_tokenizer_open_mem: return the bytes of file NAME
 * ("tokenizer.json", "tokenizer_config.json", ...) and set *len, or NULL when
 * the file is absent. The bytes must stay valid during the call only. */
struct llm_tok_files {
	const char *(*get)(void *ctx, const char *name, size_t *len);
	void *ctx;
};

/* Token ids (model.vocab and added_tokens) must be below the model's
 * config.json vocab_size when config.json is among the files (beside
 * tokenizer.json, or in a checkpoint's metadata), else below this bound (the
 * largest vocab_size config.json may give): the tables are indexed by id,
 * so a larger id is LLM_ERR_RANGE naming the file and the field
 * ("tokenizer.json: model.vocab[\"x\"]: id 1000000000 is not below
 * config.json's vocab_size 512"), before anything is sized by it. */
#define LLM_TOKENIZER_MAX_IDS (1 << 24)

/* Open DIR/tokenizer.json and the config files next to it. On failure *tk
 * is NULL and the message names the file ("DIR/tokenizer.json: model:
 * unknown type 'XYZ'"). LLM_ERR_IO, LLM_ERR_FORMAT, LLM_ERR_UNSUPPORTED,
 * LLM_ERR_NOMEM. */
enum llm_status llm_tokenizer_open(struct llm_tokenizer **tk, const char *dir);
/* The same from memory (a single-file checkpoint's __metadata__). ORIGIN
 * names the source in messages ("model.safetensors"). tokenizer.json is
 * required; the other files are optional. */
enum llm_status llm_tokenizer_open_mem(struct llm_tokenizer **tk, const char *origin,
                                       const struct llm_tok_files *files);

struct llm_ckpt;
/* The tokenizer whose side files an open checkpoint carries (a single-file
 * checkpoint's __metadata__, or a directory's files); ORIGIN names it in
 * errors (tokenizer_ckpt.c). */
enum llm_status llm_tokenizer_open_ckpt(struct llm_tokenizer **tk, const char *origin,
                                        const struct llm_ckpt *ck);
/* The tokenizer of the model at PATH: a directory, or a .safetensors file
 * whose metadata carries tokenizer.json, else the directory holding it. */
enum llm_status llm_tokenizer_open_model(struct llm_tokenizer **tk, const char *path);
/* llm_tokenizer_open_model; on failure *ABSENT tells that PATH is a
 * directory without tokenizer.json (a checkpoint made without tokenizer
 * files, which runs from token ids), as against broken files. */
enum llm_status llm_tokenizer_open_optional(struct llm_tokenizer **tk, const char *path, int *absent);
void llm_tokenizer_close(struct llm_tokenizer *tk);

/* Encode LEN bytes of UTF-8 TEXT. ADD_SPECIAL applies the post-processor
 * (BOS and the like), as add_special_tokens=True does. Special-token text
 * in TEXT always becomes the special id (split_special_tokens=False).
 * *ids is malloc'ed (caller frees; non-NULL even when *n is 0).
 * Thread-safe on one tokenizer. LLM_ERR_FORMAT on invalid UTF-8. */
enum llm_status llm_tokenizer_encode(const struct llm_tokenizer *tk, const char *text,
                                     size_t len, bool add_special, int32_t **ids, size_t *n);
/* Decode N ids to text (malloc'ed, NUL-terminated, *len bytes; caller
 * frees), as decode(ids, skip_special_tokens=SKIP_SPECIAL) does.
 * LLM_ERR_RANGE for an id outside [0, n_vocab) or with no token. */
enum llm_status llm_tokenizer_decode(const struct llm_tokenizer *tk, const int32_t *ids,
                                     size_t n, bool skip_special, char **text, size_t *len);

/* The text ID adds after other text, as decode gives it mid-sequence: a
 * leading space that decode drops at the start of a text is kept (the
 * text of the ids of "a" then ID, less that of "a"). Malloc'ed as decode's;
 * LLM_ERR_RANGE as decode. For log-prob tokens. */
enum llm_status llm_tokenizer_piece(const struct llm_tokenizer *tk, int32_t id, char **text, size_t *len);

/* The bytes ID stands for, where its piece cannot show them (part of a
 * UTF-8 character comes out as U+FFFD): a byte-fallback token (<0xXX>) is
 * its byte, a byte-level token the bytes its characters map to. Other
 * tokens: their piece. Malloc'ed; for log-prob "bytes". */
enum llm_status llm_tokenizer_piece_bytes(const struct llm_tokenizer *tk, int32_t id, char **bytes, size_t *len);

/* Streaming decode: push ids one at a time; each push returns only text
 * that later ids cannot change (whole UTF-8 characters, byte-fallback runs
 * that are complete, spaces that clean-up could still remove held back).
 * The concatenation of everything returned by push and flush equals
 * llm_tokenizer_decode of all pushed ids. Zero the struct, then init.
 * Primed with a prompt (llm_detok_stream_prime), it is a continuation's
 * text instead: decode(prompt + pushed) less decode(prompt), as vLLM and
 * OpenAI give it, so a SentencePiece token's leading space is kept. */
struct llm_detok_stream {
	const struct llm_tokenizer *tk;
	bool skip_special;
	int32_t *ids;          /* (cap) the ids of the current window */
	size_t n, cap;
	size_t emitted;        /* bytes of decode(ids[0:n]) already returned */
	char *out;             /* the last returned text (owned) */
	bool junction;         /* primed, nothing returned yet: the text starts after */
	size_t fixed;          /*   FIXED bytes of decode(ids) (the prompt's, final) and */
	char *tail;            /*   the longest match of TAIL (tail_len bytes, owned): the rest */
	size_t tail_len;       /*   of the prompt's text, which later ids may still change */
};
void llm_detok_stream_init(struct llm_detok_stream *s, const struct llm_tokenizer *tk,
                           bool skip_special);
/* Before the first push: the N ids of the prompt the pushed ids continue
 * (ids TK lacks are left out). The stream keeps the prompt's last ids as
 * context, so what it returns is decode(prompt + pushed) less the longest
 * common prefix with decode(prompt), the prompt's own text never returned
 * (a character split between prompt and continuation comes out whole).
 * LLM_ERR_NOMEM. */
enum llm_status llm_detok_stream_prime(struct llm_detok_stream *s, const int32_t *ids, size_t n);
/* *text (NUL-terminated, *len bytes, possibly "") stays valid until the next
 * call on S. */
enum llm_status llm_detok_stream_push(struct llm_detok_stream *s, int32_t id,
                                      const char **text, size_t *len);
/* Return whatever was held back (end of generation). */
enum llm_status llm_detok_stream_flush(struct llm_detok_stream *s, const char **text,
                                       size_t *len);
void llm_detok_stream_free(struct llm_detok_stream *s);

/* Fill D, the engine's detokenizer interface (detok.h), with one
 * llm_detok_stream per request over TK, special tokens left out, primed
 * with the request's prompt (prime: the continuation's text). An id TK
 * lacks adds no text, as Hugging Face's decode drops it: models pad their
 * vocabulary past the tokenizer's (and random checkpoints are given any
 * tokenizer), and a sampled padding id must not end the request. */
void llm_tokenizer_detok(struct llm_detok *d, const struct llm_tokenizer *tk);

/* The most bytes of text that can encode (special tokens on or off) into
 * N_TOKENS tokens or fewer: text longer than that needs more tokens, so it
 * can be refused by its length before it is encoded (a 1 MiB prompt costs
 * seconds to encode). The bound is the longest token text times what the
 * normalizer can shrink; SIZE_MAX when text can vanish (a normalizer that
 * strips, a pre-tokenizer that removes, fused unknowns, added tokens that
 * strip the whitespace beside them). */
size_t llm_tokenizer_max_bytes(const struct llm_tokenizer *tk, int64_t n_tokens);
/* config.json's max_position_embeddings when it was among the tokenizer's
 * files, else 0: no run of the model has a longer context. */
int llm_tokenizer_model_ctx(const struct llm_tokenizer *tk);
/* Lookups. n_vocab is one more than the largest id (model vocab and added
 * tokens). bos/eos are -1 when the files name none. */
int32_t llm_tokenizer_n_vocab(const struct llm_tokenizer *tk);
int32_t llm_tokenizer_bos(const struct llm_tokenizer *tk);
int32_t llm_tokenizer_eos(const struct llm_tokenizer *tk);
/* Whether ID ends generation: eos_token of the config, and every id of
 * generation_config.json's eos_token_id (a number or a list). */
bool llm_tokenizer_is_eos(const struct llm_tokenizer *tk, int32_t id);
/* The end-of-generation ids (at most 16), as above. */
size_t llm_tokenizer_eos_ids(const struct llm_tokenizer *tk, const int32_t **ids);
bool llm_tokenizer_is_special(const struct llm_tokenizer *tk, int32_t id);
/* Token text as stored (byte-level tokens in their Ġ form), or NULL. */
const char *llm_tokenizer_token(const struct llm_tokenizer *tk, int32_t id);
/* The id of token text S (added tokens first, then the model vocab), or -1. */
int32_t llm_tokenizer_find(const struct llm_tokenizer *tk, const char *s);
/* Whether encode(add_special = true) puts BOS first. */
bool llm_tokenizer_adds_bos(const struct llm_tokenizer *tk);

/* The chat template of tokenizer_config.json (the "default" one when it is
 * a list of named templates), or NULL. */
const char *llm_tokenizer_chat_template(const struct llm_tokenizer *tk);
/* tokenizer_config.json as a JSON text ("{}" when absent), for the template
 * variables (bos_token, eos_token, ... and additional_special_tokens). */
const char *llm_tokenizer_config_json(const struct llm_tokenizer *tk);

#endif
