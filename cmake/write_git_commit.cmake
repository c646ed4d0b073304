# Run at every build (not only at configure time), so a binary names the commit it was built from:
#   cmake -DSOURCE_DIR=... -DOUTPUT=... -P write_git_commit.cmake
# The header is rewritten only when the commit changes, so an unchanged tree recompiles nothing.
execute_process(COMMAND git describe --always --dirty --abbrev=12 WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT commit)
  set(commit "unknown")
endif()
set(content "#define KITE_GIT_COMMIT \"${commit}\"\n")
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} old)
endif()
if(NOT "${old}" STREQUAL "${content}")
  file(WRITE ${OUTPUT} "${content}")
endif()
