//go:build linux && arm64

package ibv

// sizeofPthreadMutex is sizeof(pthread_mutex_t) in glibc on arm64.
const sizeofPthreadMutex = 48
