/* The subcommands of the kite CLI. Each takes the arguments after its name (argv[0] is the subcommand)
 * and returns the process exit code: 0 on success, 1 on any error (after one line on stderr), 2 on a
 * usage error. tools/kite.c dispatches to them. */
#ifndef KITE_TOOLS_COMMANDS_H
#define KITE_TOOLS_COMMANDS_H

int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_cache(int argc, char **argv);

#endif
