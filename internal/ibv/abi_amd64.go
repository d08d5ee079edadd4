//go:build linux && amd64

package ibv

// sizeofPthreadMutex is sizeof(pthread_mutex_t) in glibc on amd64.
const sizeofPthreadMutex = 40
