/* common/llm.h: the one header the tools include. */
#ifndef LLM_H
#define LLM_H

#include "status.h"
#include "dtype.h"
#include "safetensors.h"
#include "ckpt.h"
#include "args.h"
#include "fileio.h"
#include "quantize.h"
#include "tokenizer.h"
#include "jinja.h"
#include "backend.h"
#include "kvcache.h"
#include "model.h"
#include "sampler.h"
#include "generate.h"
#include "scheduler.h"
#include "memplan.h"
#include "score.h"
#include "eval.h"
#include "jobs.h"
#include "textmode.h"
#include "buf.h"
#include "request.h"
#include "guide.h"
#include "partition.h"
#include "comm.h"
#include "lora.h"
#include "train.h"

#include "banned.h"
#endif
