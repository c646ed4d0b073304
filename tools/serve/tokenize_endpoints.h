/* POST /tokenize and POST /detokenize, in vLLM's shapes:
 *   {"prompt": "text"} or {"messages": [...]} (rendered with the chat template)
 *       -> {"count": N, "max_model_len": L, "tokens": [...], "token_strs": null}
 *   {"tokens": [...]} -> {"prompt": "text"}
 * "model", when given, must name the served model. Both run on the loop thread. */
#ifndef KITE_TOOLS_SERVE_TOKENIZE_ENDPOINTS_H
#define KITE_TOOLS_SERVE_TOKENIZE_ENDPOINTS_H

#include "serve/router.h"

void tokenize_endpoints_tokenize(router *rt, struct evhttp_request *request);
void tokenize_endpoints_detokenize(router *rt, struct evhttp_request *request);

#endif
