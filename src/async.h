/*
 * The async-event thread: one per init, watching every open device's async
 * fd. Fatal device and port events set the device's `fatal` code, which the
 * data path turns into an error on its next call. Joined at finalize and at
 * unload, so nothing outlives the plugin.
 */
#ifndef ERDMA_ASYNC_H
#define ERDMA_ASYNC_H

int async_start(void);
void async_stop(void);

#endif
