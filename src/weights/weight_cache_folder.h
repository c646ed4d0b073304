/* The weight cache's folder (kite_weight_cache_list / _clear / _default_dir in kite.h are defined here). */
#ifndef KITE_WEIGHTS_WEIGHT_CACHE_FOLDER_H
#define KITE_WEIGHTS_WEIGHT_CACHE_FOLDER_H

#include "kite.h"

/* Creates dir and its missing parents (mode 0700); an existing folder is fine. */
kite_status weight_cache_folder_make(const char *dir);

#endif
