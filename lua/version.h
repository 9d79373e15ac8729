/* The one place the version is written. */
#ifndef RL_VERSION_H
#define RL_VERSION_H

#define RL_VERSION "0.1.0"

#endif
